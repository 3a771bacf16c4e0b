-- Several regions: a grant of the home region put into a region's pool (after prelude.lua),
-- and what the home was charged with taken off what the region owed. A block joins the newer
-- one while that one lives; two live blocks merge under the earlier expiry, so no unit lives
-- past its lifetime. After a grant short of what was asked for, the refill marker stays for
-- `retry_ms` (at least the time the home needs to have a unit again), so the region does not
-- ask again before; 0: the marker goes at once.
-- A block lives from the time its refill was asked for (`asked_at`, the time of the check that
-- asked, on this Redis's clock), not from the time it lands: a grant that lands later than
-- `late_us` after it was asked for, or on a clock that has stepped back since, is dropped (the
-- home has charged it; no unit is spent later than its lifetime after its grant, however long
-- this Redis stalled). `asked_at` 0: no units were asked for (a charge only).
-- KEYS[1]  the pool hash (see regional_spend.lua)
-- KEYS[2]  the refill marker
-- ARGV     now|'', granted, charged, lifetime_us, pool_ttl_ms, retry_ms, asked_at_us, late_us
-- Reply    {the units in the pool, the granted units dropped}
local now = clock()
local granted = int_arg(2, 'granted', 0)
local charged = int_arg(3, 'charged', 0)
local lifetime = int_arg(4, 'lifetime', 1)
local pool_ttl = int_arg(5, 'pool_ttl', 1)
local retry_ms = int_arg(6, 'retry', 0)
local asked_at = int_arg(7, 'asked_at', 0)
local late = int_arg(8, 'late', 0)

local h = redis.call('HMGET', KEYS[1], 'u1', 'e1', 'u2', 'e2', 'o', 'n')
local function field(i)
  if h[i] then
    return stored_int(h[i], 'pool')
  end
  return 0
end
local u1, e1, u2, e2, owed = field(1), field(2), field(3), field(4), field(5)
local seen = field(6)
if seen > now then
  -- The clock stepped back: how long the blocks have lived is not known, so they go.
  u1, u2 = 0, 0
end
local dropped = 0
if asked_at == 0 or now < asked_at or now - asked_at > late then
  granted, dropped = 0, granted
end
if e1 <= now then u1, e1 = 0, 0 end
if e2 <= now then u2, e2 = 0, 0 end
owed = owed - charged
if owed < 0 then owed = 0 end
if granted > 0 then
  if u1 > 0 and u2 > 0 then
    u1, e1 = u1 + u2, math.min(e1, e2)
  elseif u2 > 0 then
    u1, e1 = u2, e2
  end
  u2, e2 = granted, asked_at + lifetime
end
redis.call('HSET', KEYS[1], 'u1', fmt(u1), 'e1', fmt(e1), 'u2', fmt(u2), 'e2', fmt(e2),
  'o', fmt(owed), 'n', fmt(now))
redis.call('PEXPIRE', KEYS[1], pool_ttl)
if retry_ms == 0 then
  redis.call('DEL', KEYS[2])
else
  redis.call('SET', KEYS[2], '1', 'PX', retry_ms)
end
return { u1 + u2, dropped }
