-- Token bucket, a place in the key's time (after prelude.lua), paced as GCRA's
-- (gcra_schedule.lua): steady (pace 0) when the bucket is full, burst (pace 1) when it holds
-- the call's cost. The call takes its cost then: at once as token_bucket.lua takes it, or
-- later, the credit time moved to that moment (ahead of now: the bucket owes the tokens until
-- then, as a settlement's debt does). A place further away than `budget` is not kept:
-- nothing is written, and the reply says how far it is.
-- KEYS[1]  the bucket hash
-- KEYS[2]  (optional) the key's ban (see prelude.lua)
-- ARGV     now|'', cost, emission_us, burst, budget_us, pace (0|1)
-- Reply    as gcra_schedule.lua's: {1, tokens left, 0, full again in, wait, now} when kept;
--          {0, tokens, wait until the place (-1: never), full again in, 0} when not;
--          {2, 0, left_us, left_us, 0} while the key is banned
local now, emission, burst, cost, tolerance = bucket_args()
local budget = int_arg(5, 'budget', 0)
local pace = ARGV[6]
if pace ~= '0' and pace ~= '1' then
  fail('invalid argument pace')
end

local banned = ban_left(KEYS[2], now)
if banned > 0 then
  return { 2, 0, banned, banned, 0 }
end

local tokens, ts, t_eff = stored_bucket(now, emission, burst)
if cost > burst then
  return { 0, tokens, -1, bucket_wait(tokens, ts, t_eff, now, emission, burst), 0 }
end
local want = cost
if pace == '0' then
  want = burst
end
local wait = bucket_wait(tokens, ts, t_eff, now, emission, want)
if wait > budget then
  return { 0, tokens, wait, bucket_wait(tokens, ts, t_eff, now, emission, burst), 0 }
end
if wait == 0 then
  tokens = tokens - cost
else
  tokens, ts = want - cost, now + wait
end
local full_in = ts + (burst - tokens) * emission - now
redis.call('HSET', KEYS[1], 'n', fmt(tokens), 't', fmt(ts))
redis.call('PEXPIRE', KEYS[1], ms_ceil(full_in))
return { 1, tokens, 0, full_in, wait, now }
