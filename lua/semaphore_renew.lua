-- Concurrency slots, renew: moves a holder's deadline to one lease from now.
-- KEYS[1]  the holders ZSET
-- ARGV     now|'', lease_us, holder
-- Reply    1 when renewed, 0 when the holder holds no slot (released, expired, state lost)
--
-- A lease past its deadline is gone even if no acquire has swept it yet: others may count on
-- its slot. ZADD XX never adds a holder back.
local now = clock()
local lease = int_arg(2, 'lease', 1)
local holder = ARGV[3]

local score = redis.call('ZSCORE', KEYS[1], holder)
if not score then
  return 0
end
if stored_int(score, 'lease deadline') <= now then
  redis.call('ZREM', KEYS[1], holder)
  return 0
end
local deadline = now + lease
redis.call('ZADD', KEYS[1], 'XX', fmt(deadline), holder)
local ttl = redis.call('PTTL', KEYS[1])
if ttl < math.ceil(lease / 1000) then
  redis.call('PEXPIRE', KEYS[1], ms_ceil(lease))
end
return 1
