-- A call's units settled to what its answer said it used (a model API's tokens: the call
-- took its estimate before it was sent, see upstream_take.lua).
-- KEYS[1]  the hash described in upstream_take.lua
-- ARGV     now|'', taken (the units the call took), used (the units it used)
-- Reply    1 when the hash was changed, else 0
--
-- Used beyond what was taken is a debt: the next free place in the pace moves on by the
-- excess' time (from now when the pace had passed: the units were spent just now). Used
-- below it gives back: the pace moves back by the difference' time, never before now (no
-- burst is made of units given back). A known window's count moves alike (never below 0).
-- A key that has expired is left alone: nothing is known to correct.
local now = clock()
local taken = int_arg(2, 'taken', 0)
local used = int_arg(3, 'used', 0)
if taken == used or redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local st = redis.call('HMGET', KEYS[1], 'n', 'w', 't', 'r', 'e')
if st[1] and st[2] then
  local n = stored_int(st[1], 'rate quota')
  local w = stored_int(st[2], 'rate window')
  if n > 0 and w > 0 then
    local i = math.ceil(w * 100 / (n * 97))
    local pace = now
    if st[3] then
      pace = stored_int(st[3], 'pace')
    end
    if used > taken then
      pace = math.min(math.max(pace, now) + math.min((used - taken) * i, MAX), MAX)
    elseif pace > now then
      pace = math.max(pace - math.min((taken - used) * i, MAX), now)
    end
    redis.call('HSET', KEYS[1], 't', fmt(pace))
    local keep = math.max(pace - now, 0) + 60000000
    if redis.call('PTTL', KEYS[1]) < math.ceil(keep / 1000) then
      redis.call('PEXPIRE', KEYS[1], ms_ceil(keep))
    end
  end
end
if st[4] and st[5] and stored_int(st[5], 'window end') > now then
  local left = stored_int(st[4], 'remaining')
  if used > taken then
    left = math.max(left - (used - taken), 0)
  else
    left = math.min(left + (taken - used), MAX)
  end
  redis.call('HSET', KEYS[1], 'r', fmt(left))
end
return 1
