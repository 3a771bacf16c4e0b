-- Token bucket: a hash {n = whole tokens, t = time the last whole token was credited}.
-- Tokens are credited one emission interval at a time, so all arithmetic is on integers.
-- A missing key is a full bucket; the key expires when the bucket would be full again.
-- KEYS[1]  the bucket hash
-- KEYS[2]  (optional) the key's ban (see prelude.lua)
-- ARGV     now|'', cost, emission_us, burst
-- Reply    the shared 4 integers; when admitted, then `now` (the bucket is full again at
--          now + reset_after_us: GCRA's time, which a refund needs, see refund_ledger.lua)
local now, emission, burst, cost, tolerance = bucket_args()
local banned = ban_left(KEYS[2], now)
if banned > 0 then
  return { 2, 0, banned, banned }
end

local tokens, ts, t_eff = stored_bucket(now, emission, burst)

-- Time from now until `want` whole tokens are in the bucket.
local function wait_for(want)
  return bucket_wait(tokens, ts, t_eff, now, emission, want)
end

if cost > burst then
  return { 0, tokens, -1, wait_for(burst) }
end
if tokens < cost then
  return { 0, tokens, wait_for(cost), wait_for(burst) }
end

tokens = tokens - cost
local full_in = wait_for(burst)
redis.call('HSET', KEYS[1], 'n', fmt(tokens), 't', fmt(ts))
redis.call('PEXPIRE', KEYS[1], ms_ceil(full_in))
return { 1, tokens, 0, full_in, now }
