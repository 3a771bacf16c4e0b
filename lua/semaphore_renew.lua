-- Concurrency slots, renew: moves a holder's deadline to one time to live from now. Follows the
-- prelude and semaphore_epoch.lua.
-- KEYS[1]  the holders ZSET
-- KEYS[2]  the epoch marker (see semaphore_epoch.lua)
-- KEYS[3]  released holders: a ZSET of holder ids scored by the end of their guard (µs)
-- ARGV     now|'', ttl_us, holder, known epoch (0: none), pause_us
-- Reply    {held (1: renewed; 0: not held, put back; 2: released, not put back), epoch}
--
-- A holder that is not held (its time to live ran out unrenewed, or the server lost its state) is
-- put back: its request still runs, so it counts again, even if that takes the key over its
-- limit (new requests are then refused until enough end). Except a holder released while a
-- renewal of it got no answer: that renewal may arrive here after the release, and must not
-- take the slot again.
local now = clock()
local ttl = int_arg(2, 'ttl', 1)
local holder = ARGV[3]
if holder == nil or holder == '' then
  fail('invalid argument holder')
end
local known = int_arg(4, 'epoch', 0)
local pause = int_arg(5, 'pause', 0)
local e = epoch(now, known, pause)

local held = 1
local score = redis.call('ZSCORE', KEYS[1], holder)
if not score or stored_int(score, 'deadline') <= now then
  local released = redis.call('ZSCORE', KEYS[3], holder)
  if released and stored_int(released, 'release guard') > now then
    return { 2, e }
  end
  held = 0
end
redis.call('ZADD', KEYS[1], fmt(now + ttl), holder)
local left = redis.call('PTTL', KEYS[1])
if left < math.ceil(ttl / 1000) then
  redis.call('PEXPIRE', KEYS[1], ms_ceil(ttl))
end
return { held, e }
