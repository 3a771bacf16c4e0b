-- Reservation for GCRA (a unit lease): takes up to `up_to` units at once, whatever the key
-- has available, at least `cost`; else denies exactly as gcra.lua would deny a check of
-- `cost`. The TAT moves by granted * emission, as if `granted` checks of one unit had run.
-- KEYS[1]  TAT
-- ARGV     now|'', emission_us, burst, cost, up_to
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us, granted};
--          when granted, then `now` (the units lie just before now + reset_after_us)
local now, emission, burst, cost, tolerance = bucket_args()
local up_to = int_arg(5, 'up_to', 1)
if up_to < cost then
  up_to = cost
end

local tat = now
local raw = redis.call('GET', KEYS[1])
if raw then
  tat = stored_int(raw, 'TAT')
  if tat < now then
    tat = now
  end
end

-- Whole units available now: the same test as gcra.lua's (tat + cost * emission - tolerance
-- <= now holds exactly when cost <= available).
local available = math.floor((now + tolerance - tat) / emission)
if available < 0 then
  available = 0
end
if cost > burst or available < cost then
  local retry = -1
  if cost <= burst then
    retry = tat + cost * emission - tolerance - now
  end
  return { 0, available, retry, tat - now, 0 }
end

local granted = math.min(up_to, available)
local new_tat = tat + granted * emission
redis.call('SET', KEYS[1], fmt(new_tat), 'PX', ms_ceil(new_tat - now))
return { 1, available - granted, 0, new_tat - now, granted, now }
