-- Concurrency slots (a counting semaphore with leases), acquire.
-- KEYS[1]  the holders: a ZSET of holder ids scored by lease deadline (µs)
-- ARGV     now|'', limit, lease_us, holder
-- Reply    {admitted (0|1), holders}: the unexpired holders after the call
--
-- Expired holders (deadline at or before now) are dropped first, so a crashed instance's
-- slots come back by themselves within one lease. The key lives as long as its latest lease.
local now = clock()
local limit = int_arg(2, 'limit', 1)
local lease = int_arg(3, 'lease', 1)
local holder = ARGV[4]
if holder == nil or holder == '' then
  fail('invalid argument holder')
end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', fmt(now))
local n = redis.call('ZCARD', KEYS[1])
local deadline = now + lease
-- The same holder again (a client resent the call after a cut connection): it holds its
-- slot already, so it is admitted again, its lease renewed, and counted once.
local again = redis.call('ZSCORE', KEYS[1], holder)
if not again and n >= limit then
  return { 0, n }
end
redis.call('ZADD', KEYS[1], fmt(deadline), holder)
if not again then
  n = n + 1
end
-- Another instance may hold a longer lease (another configuration during a roll-out).
local last = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local latest = stored_int(last[2], 'lease deadline')
if latest < deadline then
  latest = deadline
end
redis.call('PEXPIRE', KEYS[1], ms_ceil(latest - now))
return { 1, n }
