-- Concurrency slots, the epoch: follows the prelude in the acquire and renewal scripts.
-- KEYS[2]  the epoch marker of this server (or cluster hash slot): a hash of e (the server
--          time, µs, of the first call after it had no marker: when its slots began) and p (no
--          new holder before this time, µs)
--
-- A server that lost its slots (a restart without persistence, FLUSHALL, a failover to a
-- replica that had not received them) lost the marker too. A caller that had seen the old
-- epoch (`known`; 0 when it saw none) knows that running requests lost their slots and will
-- put them back at their next renewal: no new holder is admitted for `pause` µs, the time
-- every running holder needs to renew. A caller that saw no epoch (a new instance) cannot
-- tell a loss from a first use; when a caller that knew the old epoch comes later, it pauses
-- admissions from the new epoch's start.
local EPOCH_TTL_MS = 86400000 -- a day from the last call (a limiter forgets after 12 hours)

local function epoch(now, known, pause)
  local m = redis.call('HMGET', KEYS[2], 'e', 'p')
  local e, p
  if not m[1] then
    e = now
    p = 0
    if known ~= 0 then
      p = now + pause
    end
    redis.call('HSET', KEYS[2], 'e', fmt(e), 'p', fmt(p))
  else
    e = stored_int(m[1], 'epoch')
    p = stored_int(m[2] or '0', 'epoch pause')
    if known ~= 0 and known ~= e and p < e + pause then
      p = e + pause
      redis.call('HSET', KEYS[2], 'p', fmt(p))
    end
  end
  redis.call('PEXPIRE', KEYS[2], EPOCH_TTL_MS)
  return e, p
end
