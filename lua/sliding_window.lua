-- Sliding-window log with per-request cost.
-- KEYS[1]  sorted set: one member per admitted request, score = time (us),
--          member = 'TOTAL:SEQ': TOTAL is the running total of units admitted up to and
--          including this request (increasing), zero-padded to 16 digits so that members
--          sharing a score sort in numeric order; SEQ is the request's sequence number in this
--          log (never reused), which a refund names it by.
-- KEYS[2]  hash: a = running total of the newest member, r = running total of the newest
--          expired member, l = time of the newest member (the log never moves backwards in
--          time), s = the last sequence number given
-- KEYS[3]  (optional) the key's ban (see prelude.lua)
-- ARGV     now|'', cost, window_us, limit
-- Reply    the shared 4 integers; when admitted, then the member's time and sequence number.
-- Units in the window are a - r: no loop over members, O(log n) per call. A refund
-- (sliding_window_refund.lua) removes a member and moves the totals on one side of it,
-- rewriting at most 64 members.
local now = clock()
local window = int_arg(3, 'window', 1000)
local limit = int_arg(4, 'limit', 1)
local cost = int_arg(2, 'cost', 1)
local banned = ban_left(KEYS[3], now)
if banned > 0 then
  return { 2, 0, banned, banned }
end

local added, removed, last, seq = 0, 0, 0, 0
local meta = redis.call('HMGET', KEYS[2], 'a', 'r', 'l', 's')
if meta[1] or meta[2] or meta[3] or meta[4] then
  added = stored_int(meta[1], 'admitted total')
  removed = stored_int(meta[2], 'expired total')
  last = stored_int(meta[3], 'timestamp')
  seq = stored_int(meta[4], 'sequence number')
else
  -- The hash is gone but the log may not be (eviction, a stray DEL): rebuild the totals from
  -- the log, counting every member still in it as in use. This over-counts, never under-counts.
  local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #newest > 0 then
    added = member_total(newest[1])
    last = stored_int(newest[2], 'log score')
    seq = member_seq(newest[1])
  end
end
local clock_now = now
if now < last then
  now = last
end

-- Drop members that left the window (score <= now - window).
local cutoff = now - window
local newest_expired = redis.call('ZREVRANGEBYSCORE', KEYS[1], cutoff, '-inf', 'LIMIT', 0, 1)
if #newest_expired > 0 then
  removed = member_total(newest_expired[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
end
local count = redis.call('ZCARD', KEYS[1])
if count == 0 then
  removed = added
end
local used = added - removed
if used < 0 or used > MAX then
  fail('corrupted totals under ' .. KEYS[2])
end

local remaining = limit - used
if remaining < 0 then
  remaining = 0 -- the limit was lowered since these members were written
end

-- The newest member was logged at `last` (the hash keeps it; a rebuilt hash read it from the
-- log), so the log empties at last + window.
local function reset_after()
  if count == 0 then
    return 0
  end
  return last + window - now
end

if cost > limit or used + cost > limit then
  if #newest_expired > 0 and meta[1] then
    redis.call('HSET', KEYS[2], 'r', fmt(removed)) -- keeps the hash's expiry
  end
  if cost > limit then
    return { 0, remaining, -1, reset_after() }
  end
  -- The oldest member whose expiry frees enough units: the first whose running total reaches
  -- `target`. Every member holds at least one unit, so it is at index target - removed - 1 or
  -- before; if the member there holds exactly that total, every member up to it holds one
  -- unit and it is the one (one read, the common case). Otherwise: binary search below it.
  local target = removed + used + cost - limit
  local lo, hi = 0, target - removed - 1
  if hi > count - 1 then
    hi = count - 1
  end
  local probe = redis.call('ZRANGE', KEYS[1], hi, hi, 'WITHSCORES')
  if member_total(probe[1]) == removed + hi + 1 then
    return { 0, remaining, stored_int(probe[2], 'log score') + window - now, reset_after() }
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local m = redis.call('ZRANGE', KEYS[1], mid, mid)
    if member_total(m[1]) >= target then
      hi = mid
    else
      lo = mid + 1
    end
  end
  local first = redis.call('ZRANGE', KEYS[1], lo, lo, 'WITHSCORES')
  return { 0, remaining, stored_int(first[2], 'log score') + window - now, reset_after() }
end

added = added + cost
seq = seq + 1
redis.call('ZADD', KEYS[1], fmt(now), member(added, seq))
redis.call('HSET', KEYS[2], 'a', fmt(added), 'r', fmt(removed), 'l', fmt(now), 's', fmt(seq))
-- If the clock went backwards, the log's time runs ahead of the key's clock by the gap.
local ttl = ms_ceil(window + now - clock_now)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return { 1, remaining - cost, 0, window, now, seq }
