-- Concurrency slots (a counting semaphore whose holders expire), acquire. Follows the
-- prelude and semaphore_epoch.lua.
-- KEYS[1]  the holders: a ZSET of holder ids scored by the deadline of their time to live (µs)
-- KEYS[2]  the epoch marker (see semaphore_epoch.lua)
-- ARGV     now|'', limit, ttl_us, holder, known epoch (0: none), pause_us
-- Reply    {admitted (0|1), holders, epoch, paused_us}: the unexpired holders after the call,
--          the epoch, and how long admissions stay paused (0: not paused)
--
-- Expired holders (deadline at or before now) are dropped first, so a crashed instance's
-- slots come back by themselves within one time to live. The key lives as long as its
-- latest deadline.
local now = clock()
local limit = int_arg(2, 'limit', 1)
local ttl = int_arg(3, 'ttl', 1)
local holder = ARGV[4]
if holder == nil or holder == '' then
  fail('invalid argument holder')
end
local known = int_arg(5, 'epoch', 0)
local pause = int_arg(6, 'pause', 0)
local e, paused_until = epoch(now, known, pause)
local paused = 0
if paused_until > now then
  paused = paused_until - now
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
local n = redis.call('ZCARD', KEYS[1])
local deadline = now + ttl
-- The same holder again (a client resent the call after a cut connection): it holds its
-- slot already, so it is admitted again, its time to live renewed, and counted once.
local again = redis.call('ZSCORE', KEYS[1], holder)
if not again and (n >= limit or paused > 0) then
  return { 0, n, e, paused }
end
redis.call('ZADD', KEYS[1], fmt(deadline), holder)
if not again then
  n = n + 1
end
-- Another instance may give a longer time to live (another configuration during a roll-out).
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local latest = stored_int(last[2], 'deadline')
if latest < deadline then
  latest = deadline
end
redis.call('PEXPIRE', KEYS[1], ms_ceil(latest - now))
return { 1, n, e, paused }
