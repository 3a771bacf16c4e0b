-- Bans a key (after prelude.lua): every check of it is denied until the ban ends, by the
-- check's own script, which reads KEYS[1] (see keys.rs). Replaces a ban the key has.
-- KEYS[1]  the key's ban: when it ends, in microseconds on the server's clock
-- ARGV     now|'', duration_us
-- Reply    when the ban ends
local now = clock()
local duration = int_arg(2, 'duration', 1)
local ends = now + duration
if ends > MAX then
  fail('invalid argument duration')
end
redis.call('SET', KEYS[1], fmt(ends), 'PX', ms_ceil(duration))
return ends
