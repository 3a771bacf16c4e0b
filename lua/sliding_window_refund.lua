-- Refund for the sliding-window log: removes the member an admitted check wrote, as if the
-- request had never happened. The members after it hold running totals that counted its
-- units: each is lowered by its cost, and so is the newest total. This costs O(k log n) for
-- the k members logged after it (a refund usually follows its check closely, so k is the
-- number of requests admitted meanwhile). A member already out of the window, or gone, has
-- nothing to give back.
-- KEYS[1]  the log (see sliding_window.lua)
-- KEYS[2]  its hash
-- ARGV     now|'', window_us, limit, cost, the member's time, the member's sequence number
-- Reply    1 when the member was removed, 0 otherwise
local now = clock()
local window = int_arg(2, 'window', 1000)
int_arg(3, 'limit', 1)
local cost = int_arg(4, 'cost', 1)
local at = int_arg(5, 'time', 0)
local seq = int_arg(6, 'sequence number', 1)

local meta = redis.call('HMGET', KEYS[2], 'a', 'l')
if not meta[1] then
  return 0 -- no totals to lower (the key expired, or lost its hash and counts everything)
end
local added = stored_int(meta[1], 'admitted total')
local last = stored_int(meta[2], 'timestamp')
if now < last then
  now = last
end
if at <= now - window then
  return 0 -- out of the window already: it holds no units any more
end

local mine
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], at, at)) do
  if member_seq(m) == seq then
    mine = m
    break
  end
end
if not mine then
  return 0
end
local total = member_total(mine)
if total < cost or added < total then
  fail('corrupted log under ' .. KEYS[1])
end
local rank = redis.call('ZRANK', KEYS[1], mine)
redis.call('ZREM', KEYS[1], mine)
local after = redis.call('ZRANGE', KEYS[1], rank, -1, 'WITHSCORES')
for i = 1, #after, 2 do
  local m = after[i]
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZADD', KEYS[1], after[i + 1], member(member_total(m) - cost, member_seq(m)))
end
if #after == 0 then
  -- It was the newest: the log's time goes back to the newest left, if any.
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #newest > 0 then
    redis.call('HSET', KEYS[2], 'l', newest[2])
  end
end
redis.call('HSET', KEYS[2], 'a', fmt(added - cost))
return 1
