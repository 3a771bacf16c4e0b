-- What an outbound throttle learned from an upstream's answer, shared by every instance.
-- KEYS[1]  the hash described in upstream_take.lua
-- ARGV     now|'', pause_us (0 = none), remaining (-1 = not known), reset_us (-1 = not
--          known), blind: how the answered call went (upstream_take.lua's reply: 0 counted,
--          1 blind, 2 first to learn a new window), quota (0 = no rate known), window_us,
--          stated (1 = the upstream stated its window, 0 = inferred from a reset), cost (the
--          units the answered call took: a blind one is no longer counted on its way)
-- Reply    1
--
-- The rate: a stated one replaces what was known (an estimate too); an inferred one keeps the
-- longest window seen (a reset is never longer than its window) and replaces an estimate. While a rate is known, an answer saying
-- that no unit is left moves the next free place in the pace one unit's time on, so that
-- calls probe the upstream again sooner than its whole-second reset but never burst.
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
local quota = int_arg(6, 'quota', 0)
local window = int_arg(7, 'window', 0)
local stated = ARGV[8] == '1'
local cost = 1
if ARGV[9] then
  cost = int_arg(9, 'cost', 0)
end

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
  blind = math.max(blind - cost, 0)
  redis.call('HSET', KEYS[1], 'b', blind)
end

local est = redis.call('HMGET', KEYS[1], 'n', 'x', 'a', 'c')
if quota > 0 and window > 0 then
  local known_w = redis.call('HGET', KEYS[1], 'w')
  if est[2] then
    -- What the upstream tells replaces an estimate.
    redis.call('HDEL', KEYS[1], 'x')
  elseif known_w and not stated then
    window = math.max(window, stored_int(known_w, 'rate window'))
  end
  redis.call('HSET', KEYS[1], 'n', fmt(quota), 'w', fmt(window))
  if not known_w and remaining >= 0 then
    -- The pace starts: the calls the upstream counted, and the blind ones still on their
    -- way, are taken as spent just now, so that the pace does not add a window's worth on top.
    local spent = math.max(quota - remaining, 0) + blind
    local pace = now + math.min(spent, quota) * math.ceil(window * 100 / (quota * 97))
    redis.call('HSET', KEYS[1], 't', fmt(math.min(pace, MAX)))
  end
end
if remaining == 0 then
  local rate = redis.call('HMGET', KEYS[1], 'n', 'w', 't')
  if rate[1] and rate[2] then
    local n = stored_int(rate[1], 'rate quota')
    local w = stored_int(rate[2], 'rate window')
    if n > 0 and w > 0 then
      local pace = now
      if rate[3] then
        pace = math.max(now, stored_int(rate[3], 'pace'))
      end
      redis.call('HSET', KEYS[1], 't', fmt(math.min(pace + math.ceil(w * 100 / (n * 97)), MAX)))
    end
  end
end

if pause > 0 then
  paused = math.max(paused, math.min(now + pause, MAX))
end
-- An upstream that tells nothing but pauses: the calls it answered without a word since the
-- first (or since the last pause ended) were its quota for the time until this pause ends;
-- the calls are paced at that rate from then on (and the calls sent before it, answered
-- without a word after it, are added). A pause answering a paced call takes an eighth off an
-- estimate.
if quota == 0 and remaining < 0 and not est[1] then
  if pause > 0 then
    local answered = 0
    if est[3] then
      answered = stored_int(est[3], 'answered count')
    end
    if answered > 0 and est[4] then
      local w = math.max(paused - stored_int(est[4], 'count start'), 1)
      redis.call('HSET', KEYS[1], 'n', fmt(answered), 'w', fmt(w), 'x', 1, 't', fmt(paused))
      redis.call('HDEL', KEYS[1], 'a', 'c')
    else
      redis.call('HSET', KEYS[1], 'c', fmt(paused))
    end
  elseif was_blind then
    redis.call('HINCRBY', KEYS[1], 'a', 1)
  end
elseif quota == 0 and est[2] and est[1] then
  local n = stored_int(est[1], 'rate quota')
  if pause > 0 and not was_blind then
    redis.call('HSET', KEYS[1], 'n', fmt(math.max(n - math.floor(n / 8), 1)))
  elseif pause == 0 and was_blind and remaining < 0 then
    -- A call sent before the estimate, answered without a word since: the upstream took it
    -- within the counted time too.
    redis.call('HSET', KEYS[1], 'n', fmt(math.min(n + 1, MAX)))
  end
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
