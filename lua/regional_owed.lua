-- Several regions: what a region owes the home on one key (after prelude.lua), taken with the
-- refill marker so that no refill runs beside the reconciliation that charges it.
-- KEYS[1]  the pool hash (see regional_spend.lua)
-- KEYS[2]  the refill marker
-- ARGV     now|'' (unused), marker_ms
-- Reply    the units owed, or -1 when a refill holds the marker
local marker_ms = int_arg(2, 'marker', 1)
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', marker_ms) then
  return -1
end
local o = redis.call('HGET', KEYS[1], 'o')
if o then
  return stored_int(o, 'pool')
end
return 0
