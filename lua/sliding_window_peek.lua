-- Sliding-window log, read without a check (after prelude.lua): what a check would see,
-- spending nothing and writing nothing. sliding_window.lua's totals, with the members that
-- left the window counted out instead of removed.
-- KEYS[1]  the log, KEYS[2] its totals (see sliding_window.lua)
-- KEYS[3]  the key's ban
-- ARGV     now|'', window_us, limit
-- Reply    {ban_left_us (0 = none), remaining, reset_after_us (until the log is empty)}
local now = clock()
local window = int_arg(2, 'window', 1000)
local limit = int_arg(3, 'limit', 1)
local banned = ban_left(KEYS[3], now)

local added, removed, last = 0, 0, 0
local meta = redis.call('HMGET', KEYS[2], 'a', 'r', 'l')
if meta[1] or meta[2] or meta[3] then
  added = stored_int(meta[1], 'admitted total')
  removed = stored_int(meta[2], 'expired total')
  last = stored_int(meta[3], 'timestamp')
else
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #newest > 0 then
    added = member_total(newest[1])
    last = stored_int(newest[2], 'log score')
  end
end
if now < last then
  now = last
end
local cutoff = now - window
local newest_expired = redis.call('ZREVRANGEBYSCORE', KEYS[1], cutoff, '-inf', 'LIMIT', 0, 1)
if #newest_expired > 0 then
  removed = member_total(newest_expired[1])
end
local count = redis.call('ZCOUNT', KEYS[1], '(' .. fmt(cutoff), '+inf')
if count == 0 then
  return { banned, limit, 0 }
end
local remaining = limit - (added - removed)
if remaining < 0 then
  remaining = 0
end
return { banned, remaining, last + window - now }
