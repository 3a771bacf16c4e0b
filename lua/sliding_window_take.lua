-- Taking units off a sliding-window log's member (after the prelude): a refund's and a
-- settlement's (sliding_window_refund.lua, sliding_window_settle.lua), with work bounded
-- whatever the log's size. A client decides how many members its log holds (up to its
-- limit), so taking units off one must not cost in proportion to them: the member is found
-- with O(log n) commands and at most REWRITE members are rewritten.
--
-- Members carry running totals (see sliding_window.lua), so taking units off one moves the
-- totals on one side of it: either every older member's total and r go up by them (as if they
-- had left the window before it), or every newer member's total (and its own, when it stays)
-- and a go down by them (as if they had never been admitted); the same counts either way.
-- When either side holds at most REWRITE members, the shorter one is rewritten and the units
-- are given back. When both hold more (a member parked deep inside a long log), the units
-- move onto the member REWRITE places older instead (the REWRITE members between are
-- rewritten): they leave the window with that member, sooner than with their own, but are
-- not given back now. Never more than the units, never less than none. A member already out
-- of the window, or gone, has nothing to give back. The twin is `take_off` in
-- src/algorithm/sliding_window.rs.
-- KEYS[1]  the log (see sliding_window.lua); KEYS[2] its hash
local REWRITE = 64

-- Rewrites members `first` to `upto` (ranks; at most REWRITE + 1 of them) with their totals
-- moved by `delta`. All are read, then all removed, before any is rewritten: a rewritten
-- member may sort past members sharing its score, and a new name may be an old one's.
local function log_shift(first, upto, delta)
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

-- Takes `units` off the member logged at `at` with sequence number `seq`, at `now` in a log
-- of `window`: removes it (`keep` false: a refund, `units` its cost) or leaves it with the
-- rest of its units (a settlement down to at least one). 1 when the units were given back,
-- 0 otherwise (nothing to give, or moved).
local function log_take_off(now, window, units, at, seq, keep)
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
  -- Never more than the member holds (a settlement of a copy of a settled decision finds it
  -- holding less than its charge), and a member kept keeps a unit.
  local before = removed
  if rank > 0 then
    before = member_total(redis.call('ZRANGE', KEYS[1], rank - 1, rank - 1)[1])
  end
  local most = total - before
  if keep then
    most = most - 1
  end
  if units > most then
    units = most
  end
  if units <= 0 then
    return 0
  end
  if added < total or removed + units > added then
    fail('corrupted log under ' .. KEYS[1])
  end
  local newer = redis.call('ZCARD', KEYS[1]) - 1 - rank
  if not keep then
    redis.call('ZREM', KEYS[1], mine)
  end

  if rank <= newer and rank <= REWRITE then
    if rank > 0 then
      log_shift(0, rank - 1, units)
    end
    redis.call('HSET', KEYS[2], 'r', fmt(removed + units))
    return 1
  end
  if newer < rank and newer <= REWRITE then
    if keep then
      log_shift(rank, rank + newer, -units)
    elseif newer > 0 then
      log_shift(rank, rank + newer - 1, -units)
    else
      -- It was the newest: the log's time goes back to the newest left.
      local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
      redis.call('HSET', KEYS[2], 'l', newest[2])
    end
    redis.call('HSET', KEYS[2], 'a', fmt(added - units))
    return 1
  end
  -- Deep inside a long log: its units go to the member REWRITE places older.
  log_shift(rank - REWRITE, rank - 1, units)
  return 0
end
