-- Several regions: the home region's grant of a block of units to a region (after
-- prelude.lua), on the key's GCRA TAT, the same key a plain GCRA check uses. First the units
-- the region admitted without the home (borrowed, or while cut off) are charged, up to a
-- drained key (what lies further back than one burst no longer limits anything); then up to
-- `want` units are taken, what the key has available, as `want` checks of one unit would.
-- KEYS[1]  the TAT
-- ARGV     now|'', want (0: only charge), emission_us, burst, charge
-- Reply    {granted, retry_us (until one unit is available; 0 when granted), now}
local now = clock()
local want = int_arg(2, 'want', 0)
local emission = int_arg(3, 'emission', 1)
local burst = int_arg(4, 'burst', 1)
local charge = int_arg(5, 'charge', 0)
local tolerance = emission * burst
if tolerance > MAX then
  fail('invalid argument burst')
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
local granted = math.min(want, available)
tat = tat + granted * emission
if tat > now then
  redis.call('SET', KEYS[1], fmt(tat), 'PX', ms_ceil(tat - now))
end
local retry = 0
if granted == 0 and want > 0 then
  retry = math.max(tat + emission - tolerance - now, 0)
end
return { granted, retry, now }
