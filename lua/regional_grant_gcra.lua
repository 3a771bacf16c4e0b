-- Several regions: the home region's grant of a block of units to a region (after
-- prelude.lua), on the key's GCRA TAT, the same key a plain GCRA check uses. First the units
-- the region admitted without the home (borrowed, or while cut off) are charged, up to a
-- drained key (what lies further back than one burst no longer limits anything); then up to
-- `want` units are taken, what the key has available, as `want` checks of one unit would.
-- KEYS[1]  the TAT
-- KEYS[2]  the regions' demands: field REGION, `want:time` of its last grant asked for
-- ARGV     now|'', want (0: only charge), emission_us, burst, charge, region, horizon_us
-- While the regions together ask for more than the key has, each gets its part of what the
-- key has in proportion to what it asked for (demands older than `horizon_us` do not count),
-- rounded down: what is left waits for the next grant.
-- Reply    {granted, retry_us (until one unit is available; 0 when granted), now}
local now = clock()
local want = int_arg(2, 'want', 0)
local emission = int_arg(3, 'emission', 1)
local burst = int_arg(4, 'burst', 1)
local charge = int_arg(5, 'charge', 0)
local region = int_arg(6, 'region', 0)
local horizon = int_arg(7, 'horizon', 1)
local tolerance = emission * burst
if tolerance > MAX then
  fail('invalid argument burst')
end
-- The demand of every region that asked within the horizon, this one's included.
local demand = want
if want > 0 then
  redis.call('HSET', KEYS[2], fmt(region), fmt(want) .. ':' .. fmt(now))
  redis.call('PEXPIRE', KEYS[2], ms_ceil(horizon))
  local all = redis.call('HGETALL', KEYS[2])
  demand = 0
  for i = 1, #all, 2 do
    local w, t = string.match(all[i + 1], '^(%d+):(%d+)$')
    w, t = tonumber(w), tonumber(t)
    if w and t and t + horizon >= now then
      demand = demand + w
    end
  end
end
local function part(available)
  if demand > available and demand > 0 then
    return math.min(want, math.floor(available * want / demand))
  end
  return math.min(want, available)
end
local tat = redis.call('GET', KEYS[1])
if tat then
  tat = stored_int(tat, 'TAT')
  if tat < now then tat = now end
else
  tat = now
end
if charge > 0 then
  tat = math.max(tat, math.min(tat + charge * emission, now + tolerance))
end
local available = math.floor((now + tolerance - tat) / emission)
if available < 0 then available = 0 end
local granted = part(available)
tat = tat + granted * emission
if tat > now then
  redis.call('SET', KEYS[1], fmt(tat), 'PX', ms_ceil(tat - now))
end
local retry = 0
if granted == 0 and want > 0 then
  retry = math.max(tat + emission - tolerance - now, emission)
end
return { granted, retry, now }
