-- Refund for the token bucket: gives back the tokens an admitted check took, into the bucket
-- credited up to now, never above the burst. A missing key is a full bucket: nothing to give.
-- A bucket full again goes away, as a rested one does.
-- KEYS[1]  the bucket hash; KEYS[2], optionally, a marker key (see `first_run` in prelude.lua)
-- ARGV     now|'', emission_us, burst, cost
-- Reply    1 when tokens were given back, 0 otherwise
local now, emission, burst, cost, tolerance = bucket_args()

if not first_run(1) then
  return 0
end
local st = redis.call('HMGET', KEYS[1], 'n', 't')
if not (st[1] or st[2]) then
  return 0
end
-- Credited exactly as a check credits it.
local tokens, ts, t_eff = credit(
  stored_int(st[1], 'token count'), stored_int(st[2], 'timestamp'), now, emission, burst)
if tokens >= burst then
  return 0
end

tokens = tokens + cost
if tokens >= burst then
  redis.call('DEL', KEYS[1])
  return 1
end
local full_in = bucket_wait(tokens, ts, t_eff, now, emission, burst)
redis.call('HSET', KEYS[1], 'n', fmt(tokens), 't', fmt(ts))
redis.call('PEXPIRE', KEYS[1], ms_ceil(full_in))
return 1
