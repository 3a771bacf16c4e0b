-- Counts one refusal of a key under a policy that bans by itself (after prelude.lua and
-- gcra_state.lua), atomically, so that the refusals every instance sends add up exactly: the
-- `after`-th refusal within `within` bans the key as ban.lua does (only the instance whose
-- refusal reached the count sets it), for `for`, or, when the key's last ban ended less than a
-- day ago, `escalate` thousandths of the last ban's duration, at most a day. A refusal of a
-- banned key does not count; the count starts afresh when a ban starts.
-- KEYS[1]  the key's ban: when it ends (see keys.rs)
-- KEYS[2]  the key's GCRA state, which gets a copy of the ban (as ban.lua writes it)
-- KEYS[3]  the key's refusals in the current window (expires with the window)
-- KEYS[4]  the key's last automatic ban, `DURATION:OFFENCE` (kept a day after it ends)
-- ARGV     now|'', after, within_us, for_us, escalate (thousandths), shadow (0|1: count, and
--          answer the ban that would be set, without setting it)
-- Reply    {refusals counted with this one (0: the key is banned, nothing counted),
--           the ban set in µs (0: none), the ban's number (1: the key's first)}
local DAY = 86400000000
local now = clock()
local after = int_arg(2, 'after', 1)
local within = int_arg(3, 'within', 1)
local base = int_arg(4, 'for', 1)
local escalate = int_arg(5, 'escalate', 1000)
local shadow = int_arg(6, 'shadow', 0)
if ban_left(KEYS[1], now) > 0 then
  return {0, 0, 0}
end
local n = redis.call('INCR', KEYS[3])
if n == 1 then
  redis.call('PEXPIRE', KEYS[3], ms_ceil(within))
end
if n < after then
  return {n, 0, 0}
end
redis.call('DEL', KEYS[3])
local duration, offence = base, 1
local last = redis.call('GET', KEYS[4])
if last then
  local d, o = string.match(last, '^(%d+):(%d+)$')
  d, o = tonumber(d), tonumber(o)
  if d == nil or o == nil or d > MAX or o > MAX then
    fail('corrupted last ban under ' .. KEYS[4])
  end
  -- On integers: the product is exact below 2^53, and anything above is over the cap.
  local p = d * escalate
  if p >= DAY * 1000 then
    duration = DAY
  else
    duration = (p - p % 1000) / 1000
  end
  offence = o + 1
end
if duration > DAY then
  duration = DAY
end
if shadow == 1 then
  return {n, duration, offence}
end
local ends = now + duration
local tat
local raw = redis.call('GET', KEYS[2])
if raw then
  tat = gcra_state(raw, KEYS[2])
end
redis.call('SET', KEYS[1], fmt(ends), 'PX', ms_ceil(duration))
gcra_write(KEYS[2], tat, ends, now)
redis.call('SET', KEYS[4], fmt(duration) .. ':' .. fmt(offence), 'PX', ms_ceil(duration + DAY))
return {n, duration, offence}
