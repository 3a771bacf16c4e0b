-- Several regions: the home region's grant of a block of tokens to a region (after
-- prelude.lua), on the key's token bucket, the same hash a plain token-bucket check uses.
-- First the units the region admitted without the home (borrowed, or while cut off) are
-- charged, down to an empty bucket; then up to `want` tokens are taken.
-- KEYS[1]  the bucket hash
-- ARGV     now|'', want (0: only charge), emission_us, burst, charge
-- Reply    {granted, retry_us (until one token is available; 0 when granted), now}
local now = clock()
local want = int_arg(2, 'want', 0)
local emission = int_arg(3, 'emission', 1)
local burst = int_arg(4, 'burst', 1)
local charge = int_arg(5, 'charge', 0)
if emission * burst > MAX then
  fail('invalid argument burst')
end
local tokens, ts, t_eff = stored_bucket(now, emission, burst)
tokens = math.max(tokens - charge, 0)
local granted = math.min(want, tokens)
tokens = tokens - granted
if tokens < burst then
  local full_in = bucket_wait(tokens, ts, t_eff, now, emission, burst)
  redis.call('HSET', KEYS[1], 'n', fmt(tokens), 't', fmt(ts))
  redis.call('PEXPIRE', KEYS[1], ms_ceil(full_in))
end
local retry = 0
if granted == 0 and want > 0 then
  retry = bucket_wait(tokens, ts, t_eff, now, emission, 1)
end
return { granted, retry, now }
