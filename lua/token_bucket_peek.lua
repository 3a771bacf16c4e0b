-- Token bucket, read without a check (after prelude.lua): what a check would see, spending
-- nothing and writing nothing (token_bucket.lua's crediting, without the write).
-- KEYS[1]  the bucket hash
-- KEYS[2]  the key's ban
-- ARGV     now|'', emission_us, burst
-- Reply    {ban_left_us (0 = none), tokens, reset_after_us (until the bucket is full)}
local now = clock()
local emission = int_arg(2, 'emission', 1)
local burst = int_arg(3, 'burst', 1)
if emission * burst > MAX then
  fail('invalid argument burst')
end
local banned = ban_left(KEYS[2], now)
local tokens, ts, t_eff = stored_bucket(now, emission, burst)
return { banned, tokens, bucket_wait(tokens, ts, t_eff, now, emission, burst) }
