-- Bans a key (after prelude.lua and gcra_state.lua): every check of it is denied until the ban
-- ends, by the check's own script, which reads KEYS[1] (see keys.rs), or for GCRA the ban's copy
-- in KEYS[2]. Replaces a ban the key has.
-- KEYS[1]  the key's ban: when it ends, in microseconds on the server's clock
-- KEYS[2]  the key's GCRA state, which gets a copy of the ban (whatever the limiter's algorithm:
--          the ban is the key's)
-- KEYS[3]  the key's refusals counted toward an automatic ban (autoban.lua), deleted: the
--          count starts afresh when a ban starts (optional)
-- ARGV     now|'', duration_us
-- Reply    when the ban ends
local now = clock()
local duration = int_arg(2, 'duration', 1)
local ends = now + duration
if ends > MAX then
  fail('invalid argument duration')
end
local tat
local raw = redis.call('GET', KEYS[2])
if raw then
  tat = gcra_state(raw, KEYS[2])
end
redis.call('SET', KEYS[1], fmt(ends), 'PX', ms_ceil(duration))
gcra_write(KEYS[2], tat, ends, now)
if KEYS[3] then
  redis.call('DEL', KEYS[3])
end
return ends
