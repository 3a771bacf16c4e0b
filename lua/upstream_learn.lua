-- What an outbound throttle learned from an upstream's answer, shared by every instance.
-- KEYS[1]  the hash described in upstream_take.lua
-- ARGV     now|'', pause_us (0 = none), remaining (-1 = not known), reset_us (-1 = not
--          known), blind: how the answered call went (upstream_take.lua's reply: 0 counted,
--          1 blind, 2 first to learn a new window)
-- Reply    1
--
-- A pause only ever grows. The window:
-- * none known, or the known one is over: the answer's is the new window. The calls sent
--   blind before it was known, other than the one answered here, may not have reached the
--   upstream yet: they are taken off what it says is left (some may be counted twice, which
--   errs on the safe side);
-- * an end within a second of the known one: the same window, which keeps the smaller count
--   (answers arrive out of order, and a stale one must not give back units spent since) and
--   the earlier end (resets are whole seconds, rounded up, so each answer bounds the end from
--   above);
-- * a later end while the known window runs (an answer that took long to come back, or a new
--   window seen early): only the smaller count is kept; the known end stays;
-- * an earlier end: a stale answer, ignored.
-- When the call that went first learns no window, the old one is forgotten, and calls go
-- blind again. The key lives a minute past the pause and the window.
local KEEP_US = 60000000
local BLIND_US = 10000000
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
local how = ARGV[5]
local probed = how == '2'
local was_blind = how == '1' or probed

local st = redis.call('HMGET', KEYS[1], 'p', 'r', 'e', 'b', 's')
local paused, left, ends, blind = 0, -1, 0, 0
if st[1] then
  paused = stored_int(st[1], 'pause')
end
if st[2] and st[3] then
  left = stored_int(st[2], 'remaining')
  ends = stored_int(st[3], 'window end')
end
if st[4] and st[5] and stored_int(st[5], 'blind since') >= now - BLIND_US then
  blind = stored_int(st[4], 'blind count')
end
-- This call's answer is back: it is no longer on its way.
if was_blind and blind > 0 then
  blind = blind - 1
  redis.call('HSET', KEYS[1], 'b', blind)
end

if pause > 0 then
  paused = math.max(paused, math.min(now + pause, MAX))
end
local known = left >= 0 and ends > now
if remaining >= 0 and reset >= 0 then
  local e = math.min(now + reset, MAX)
  if not known then
    left, ends = math.max(0, remaining - blind), e
    redis.call('HDEL', KEYS[1], 'b', 's')
  elseif e > ends + 1000000 then
    left = math.min(left, remaining)
  elseif e >= ends - 1000000 then
    left = math.min(left, remaining)
    ends = math.min(ends, e)
  end
elseif probed and not known then
  left = -1
  redis.call('HDEL', KEYS[1], 'r', 'e')
end
if probed or (left >= 0 and ends > now) then
  redis.call('HDEL', KEYS[1], 'q')
end

redis.call('HSET', KEYS[1], 'p', fmt(paused))
local until_ = paused
if left >= 0 then
  redis.call('HSET', KEYS[1], 'r', fmt(left), 'e', fmt(ends))
  until_ = math.max(until_, ends)
end
redis.call('PEXPIRE', KEYS[1], ms_ceil(math.max(until_ - now, 0) + KEEP_US))
return 1
