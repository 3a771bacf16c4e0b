-- Refund for the sliding-window log: removes the member an admitted check wrote and gives its
-- units back, with work bounded whatever the log's size. A client decides how many members
-- its log holds (up to its limit), so a refund must not cost in proportion to them: it finds
-- the member with O(log n) commands and rewrites at most REWRITE members.
--
-- Members carry running totals (see sliding_window.lua), so removing one moves the totals on
-- one side of it: either every older member's total and r go up by the cost (as if its units
-- had left the window before them), or every newer member's total and a go down by it (as if
-- they had never been admitted); the same counts either way. When either side holds at most
-- REWRITE members, the shorter one is rewritten and the units are given back: as if the
-- request had never happened. When both hold more (a member parked deep inside a long log),
-- the member is removed and its units move onto the member REWRITE places older instead (the
-- REWRITE members between are rewritten): they leave the window with that member, sooner
-- than with their own, but are not given back now. Never more than a whole refund, never
-- less than none. A member already out of the window, or gone, has nothing to give back.
-- KEYS[1]  the log (see sliding_window.lua)
-- KEYS[2]  its hash
-- ARGV     now|'', cost, window_us, limit, the member's time, the member's sequence number
-- Reply    1 when the units were given back, 0 otherwise (nothing to give, or moved)
local REWRITE = 64

local now = clock()
local window = int_arg(3, 'window', 1000)
int_arg(4, 'limit', 1)
local cost = int_arg(2, 'cost', 1)
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

-- The member: members sharing its time sort by total, hence by sequence number (both grow
-- with every admission), so a binary search over their ranks finds it.
local rank = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. fmt(at))
local hi = rank + redis.call('ZCOUNT', KEYS[1], fmt(at), fmt(at)) - 1
if hi < rank then
  return 0
end
while rank < hi do
  local mid = math.floor((rank + hi) / 2)
  if member_seq(redis.call('ZRANGE', KEYS[1], mid, mid)[1]) < seq then
    rank = mid + 1
  else
    hi = mid
  end
end
local mine = redis.call('ZRANGE', KEYS[1], rank, rank)[1]
if member_seq(mine) ~= seq then
  return 0
end
local total = member_total(mine)
if total < cost or added < total or removed + cost > added then
  fail('corrupted log under ' .. KEYS[1])
end
local newer = redis.call('ZCARD', KEYS[1]) - 1 - rank
redis.call('ZREM', KEYS[1], mine)

-- Rewrites members `first` to `upto` (ranks; at most REWRITE of them) with their totals moved
-- by `delta`. All are read, then all removed, before any is rewritten: a rewritten member may
-- sort past members sharing its score, and a new name may be an old one's.
local function shift(first, upto, delta)
  local members = redis.call('ZRANGE', KEYS[1], first, upto, 'WITHSCORES')
  local old, new = {}, {}
  for i = 1, #members, 2 do
    old[#old + 1] = members[i]
    new[#new + 1] = members[i + 1]
    new[#new + 1] = member(member_total(members[i]) + delta, member_seq(members[i]))
  end
  redis.call('ZREM', KEYS[1], unpack(old))
  redis.call('ZADD', KEYS[1], unpack(new))
end

if rank <= newer and rank <= REWRITE then
  if rank > 0 then
    shift(0, rank - 1, cost)
  end
  redis.call('HSET', KEYS[2], 'r', fmt(removed + cost))
  return 1
end
if newer < rank and newer <= REWRITE then
  if newer > 0 then
    shift(rank, rank + newer - 1, -cost)
  else
    -- It was the newest: the log's time goes back to the newest left.
    local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    redis.call('HSET', KEYS[2], 'l', newest[2])
  end
  redis.call('HSET', KEYS[2], 'a', fmt(added - cost))
  return 1
end
-- Deep inside a long log: its units go to the member REWRITE places older.
shift(rank - REWRITE, rank - 1, cost)
return 0
