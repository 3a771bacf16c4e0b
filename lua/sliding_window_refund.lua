-- Refund for the sliding-window log: removes the member an admitted check wrote, as if the
-- request had never happened. Running totals then move on one side of it (see below): this
-- costs O(k log n) for the k members on the shorter side (a refund usually follows its check
-- closely, so k is at most the number of requests of that key in flight). A member already
-- out of the window, or gone, has nothing to give back.
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

local meta = redis.call('HMGET', KEYS[2], 'a', 'r', 'l')
if not meta[1] then
  return 0 -- no totals to lower (the key expired, or lost its hash and counts everything)
end
local added = stored_int(meta[1], 'admitted total')
local removed = stored_int(meta[2], 'expired total')
local last = stored_int(meta[3], 'timestamp')
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
if total < cost or added < total or removed + cost > added then
  fail('corrupted log under ' .. KEYS[1])
end
local rank = redis.call('ZRANK', KEYS[1], mine)
local newer = redis.call('ZCARD', KEYS[1]) - 1 - rank
redis.call('ZREM', KEYS[1], mine)

-- Rewrites members `first` to `last` (ranks) with their totals moved by `delta`. All are read
-- before any is rewritten: a rewritten member may sort past members sharing its score, so
-- ranks read between writes could name a member twice and miss another. Written in chunks
-- (a few commands however many there are; unpack's stack is bounded).
local function shift(first, last, delta)
  local members = redis.call('ZRANGE', KEYS[1], first, last, 'WITHSCORES')
  local CHUNK = 2000
  -- Every old member goes before any new one is written: a new name may be an old one's.
  for from = 1, #members, CHUNK do
    local old = {}
    for i = from, math.min(from + CHUNK - 1, #members), 2 do
      old[#old + 1] = members[i]
    end
    redis.call('ZREM', KEYS[1], unpack(old))
  end
  for from = 1, #members, CHUNK do
    local new = {}
    for i = from, math.min(from + CHUNK - 1, #members), 2 do
      new[#new + 1] = members[i + 1]
      new[#new + 1] = member(member_total(members[i]) + delta, member_seq(members[i]))
    end
    redis.call('ZADD', KEYS[1], unpack(new))
  end
end

-- The units in the window are a - r. Either every older member's total and r go up by the
-- cost (as if its units had left the window before them), or every newer member's total and
-- a go down by it (as if they had never been admitted): the same counts either way, so the
-- side with fewer members is rewritten.
if rank <= newer then
  if rank > 0 then
    shift(0, rank - 1, cost)
  end
  redis.call('HSET', KEYS[2], 'r', fmt(removed + cost))
  return 1
end
if newer > 0 then
  shift(rank, rank + newer - 1, -cost)
else
  -- It was the newest: the log's time goes back to the newest left.
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('HSET', KEYS[2], 'l', newest[2])
end
redis.call('HSET', KEYS[2], 'a', fmt(added - cost))
return 1
