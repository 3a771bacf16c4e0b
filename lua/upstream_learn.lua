-- What an outbound throttle learned from an upstream's answer, shared by every instance.
-- KEYS[1]  hash: p = paused until (µs), r = units left in the upstream's window, e = the end
--          of that window (µs)
-- ARGV     now|'', pause_us (0 = none), remaining (-1 = not known), reset_us (-1 = not known)
-- Reply    1
--
-- A pause only ever grows. The window: a later end (by more than a second) is a new window,
-- whose remaining replaces the old; an end within a second of the known one is the same
-- window, which keeps the smaller remaining (answers arrive out of order, and a stale one
-- must not give back units spent since) and the earlier end (resets are whole seconds,
-- rounded up, so each answer bounds the end from above); an earlier end is a stale answer,
-- ignored. The key lives a minute past the pause and the window (see upstream_take.lua).
local KEEP_US = 60000000
local now = clock()
local pause = int_arg(2, 'pause', 0)
local remaining = tonumber(ARGV[3])
local reset = tonumber(ARGV[4])
if remaining == nil or remaining % 1 ~= 0 or remaining < -1 or remaining > MAX then
  fail('invalid argument remaining')
end
if reset == nil or reset % 1 ~= 0 or reset < -1 or reset > MAX then
  fail('invalid argument reset')
end

local st = redis.call('HMGET', KEYS[1], 'p', 'r', 'e', 'b')
local paused, left, ends = 0, -1, 0
local blind = 0
if st[4] then
  blind = stored_int(st[4], 'blind count')
end
if st[1] then
  paused = stored_int(st[1], 'pause')
end
if st[2] and st[3] then
  left = stored_int(st[2], 'remaining')
  ends = stored_int(st[3], 'window end')
end

if pause > 0 and now + pause > paused then
  paused = now + pause
end
if remaining >= 0 and reset >= 0 then
  local e = now + reset
  if left < 0 or ends <= now or e > ends + 1000000 then
    -- A new window. The calls sent blind before it was known, other than the one answered
    -- here, may not have reached the upstream yet: they are taken off what it says is left
    -- (some may be counted twice, which only errs on the safe side).
    left, ends = math.max(0, remaining - math.max(0, blind - 1)), e
    blind = 0
    redis.call('HDEL', KEYS[1], 'b')
  elseif e >= ends - 1000000 then
    if remaining < left then
      left = remaining
    end
    -- Resets are whole seconds, rounded up: each answer bounds the end from above, and
    -- the earliest bound is the closest.
    if e < ends then
      ends = e
    end
  end
end

local until_ = paused
if left >= 0 and ends > until_ then
  until_ = ends
end
if until_ <= now and left < 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('HSET', KEYS[1], 'p', fmt(paused))
if left >= 0 then
  redis.call('HSET', KEYS[1], 'r', fmt(left), 'e', fmt(ends))
  if ends > now then
    redis.call('HDEL', KEYS[1], 'q') -- the next window is known: no call is probing it
  end
end
-- Kept a while past its window, so that the next window is probed by one call first.
redis.call('PEXPIRE', KEYS[1], ms_ceil(math.max(until_ - now, 0) + KEEP_US))
return 1
