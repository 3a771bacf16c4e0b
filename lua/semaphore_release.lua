-- Concurrency slots, release: gives a holder's slot back (nothing when it holds none, so it
-- may be sent again). Follows the prelude.
-- KEYS[1]  the holders ZSET
-- KEYS[2]  (optional) released holders, see semaphore_renew.lua
-- ARGV     now|'', holder, guard_us (with KEYS[2])
-- Reply    1 when a slot was given back, 0 otherwise
--
-- With KEYS[2], a renewal of this holder got no answer and may still arrive: the holder is
-- remembered as released for guard_us, so that renewal does not put it back. Removing the
-- last holder removes the key.
local holder = ARGV[2]
if holder == nil or holder == '' then
  fail('invalid argument holder')
end
local removed = redis.call('ZREM', KEYS[1], holder)
if #KEYS > 1 then
  local now = clock()
  local guard = int_arg(3, 'guard', 1)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', fmt(now))
  redis.call('ZADD', KEYS[2], fmt(now + guard), holder)
  local ttl = redis.call('PTTL', KEYS[2])
  if ttl < math.ceil(guard / 1000) then
    redis.call('PEXPIRE', KEYS[2], ms_ceil(guard))
  end
end
return removed
