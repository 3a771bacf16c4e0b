-- Reservation for the token bucket (a unit lease): takes up to `up_to` tokens at once, what
-- the bucket holds, at least `cost`; else denies exactly as token_bucket.lua would deny a
-- check of `cost`.
-- KEYS[1]  the bucket hash
-- KEYS[2]  (optional) the key's ban (see prelude.lua)
-- ARGV     now|'', cost, emission_us, burst, up_to
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us, granted};
--          when granted, then `now` (the bucket is full again at now + reset_after_us);
--          {2, 0, left_us, left_us, 0} while the key is banned
local now, emission, burst, cost, tolerance = bucket_args()
local up_to = int_arg(5, 'up_to', 1)
if up_to < cost then
  up_to = cost
end

local banned = ban_left(KEYS[2], now)
if banned > 0 then
  return { 2, 0, banned, banned, 0 }
end

local tokens, ts, t_eff = stored_bucket(now, emission, burst)

if cost > burst then
  return { 0, tokens, -1, bucket_wait(tokens, ts, t_eff, now, emission, burst), 0 }
end
if tokens < cost then
  return { 0, tokens, bucket_wait(tokens, ts, t_eff, now, emission, cost),
    bucket_wait(tokens, ts, t_eff, now, emission, burst), 0 }
end

local granted = math.min(up_to, tokens)
tokens = tokens - granted
local full_in = bucket_wait(tokens, ts, t_eff, now, emission, burst)
redis.call('HSET', KEYS[1], 'n', fmt(tokens), 't', fmt(ts))
redis.call('PEXPIRE', KEYS[1], ms_ceil(full_in))
return { 1, tokens, 0, full_in, granted, now }
