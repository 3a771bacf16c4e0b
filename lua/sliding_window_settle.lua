-- Sliding-window log, a settlement (after prelude.lua and sliding_window_take.lua): an
-- admitted check's charge of `cost` settled to `actual` units. Below the charge, `cost -
-- actual` units come off the check's own member (see sliding_window_take.lua; the member goes
-- when `actual` is 0); above it, `actual - cost` more units are logged at now in a member of
-- their own whatever the limit: they leave the window a window later (the log's total never
-- passes 2^52: what would is not logged).
-- KEYS[1]  the log (see sliding_window.lua); KEYS[2] its hash; KEYS[3], optionally, a marker
--          key (see `first_run` in prelude.lua)
-- ARGV     now|'', cost, window_us, limit, actual, the member's time and sequence number (0
--          and 0 when settling up: unread)
-- Reply    1 when the state changed (or, settling down, the units were given back), 0
--          otherwise
local now = clock()
local window = int_arg(3, 'window', 1000)
int_arg(4, 'limit', 1)
local cost = int_arg(2, 'cost', 1)
local actual = int_arg(5, 'actual', 0)
local at = int_arg(6, 'time', 0)
local seq = int_arg(7, 'sequence number', 0)
if actual == cost or not first_run(2) then
  return 0
end
if actual < cost then
  return log_take_off(now, window, cost - actual, at, seq, actual > 0)
end

local added, removed, last, last_seq = 0, 0, 0, 0
local meta = redis.call('HMGET', KEYS[2], 'a', 'r', 'l', 's')
if meta[1] or meta[2] or meta[3] or meta[4] then
  added = stored_int(meta[1], 'admitted total')
  removed = stored_int(meta[2], 'expired total')
  last = stored_int(meta[3], 'timestamp')
  last_seq = stored_int(meta[4], 'sequence number')
else
  -- The hash is gone but the log may not be: rebuilt as sliding_window.lua rebuilds it.
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #newest > 0 then
    added = member_total(newest[1])
    last = stored_int(newest[2], 'log score')
    last_seq = member_seq(newest[1])
  end
end
local excess = actual - cost
if excess > MAX - added then
  excess = MAX - added
end
if excess <= 0 then
  return 0
end
local clock_now = now
if now < last then
  now = last
end
added = added + excess
last_seq = last_seq + 1
redis.call('ZADD', KEYS[1], fmt(now), member(added, last_seq))
redis.call('HSET', KEYS[2], 'a', fmt(added), 'r', fmt(removed), 'l', fmt(now), 's', fmt(last_seq))
local ttl = ms_ceil(window + now - clock_now)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
