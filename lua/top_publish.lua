-- An instance's top keys, published for the fleet's view (`RateLimiter::publish_top_keys`).
-- KEYS[1]  hash: each instance's snapshot, field the instance, value its snapshot
-- KEYS[2]  sorted set: each instance, scored by when it last published (ms, server time)
-- ARGV[1]  the instance
-- ARGV[2]  its snapshot
-- ARGV[3]  how long a snapshot counts (ms)
--
-- Drops the snapshots of instances that stopped publishing; both keys expire when nobody
-- publishes any more.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
for _, instance in ipairs(gone) do
  redis.call('HDEL', KEYS[1], instance)
  redis.call('ZREM', KEYS[2], instance)
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return #gone
