-- Fixed window (after prelude.lua and fixed_window_core.lua): at most `limit` units in each
-- window aligned to the clock. One MGET (the window and the ban) and, when admitted, one SET
-- per check; a refused check writes nothing.
-- KEYS[1]  the key's window (see fixed_window_core.lua)
-- KEYS[2]  the key's ban
-- ARGV     now|'', cost, limit, period_us (0 for a calendar window), calendar (0: the period,
--          1: a week from Monday, 2: a month, 3: a year, all in UTC)
-- Reply    the shared 4 integers (reset_after_us: until the window ends); admitted, then the
--          window's id
local now, cost, limit, period, calendar = window_args()
local stored
if KEYS[2] == nil then
  stored = { redis.call('GET', KEYS[1]), false }
else
  stored = redis.call('MGET', KEYS[1], KEYS[2])
end
local banned = ban_left_of(stored[2], now)
if banned > 0 then
  return { 2, 0, banned, banned }
end
local _, finish, id, count = window_state_of(stored[1], KEYS[1], now, period, calendar)
local reset = finish - now
if count + cost > limit then
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0 -- the limit was lowered since this window was written
  end
  local retry = -1
  if cost <= limit then
    retry = reset
  end
  return { 0, remaining, retry, reset }
end
count = count + cost
redis.call('SET', KEYS[1], fmt(id) .. ' ' .. fmt(count), 'PX', ms_ceil(reset))
return { 1, limit - count, 0, reset, id }
