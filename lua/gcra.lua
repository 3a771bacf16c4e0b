-- GCRA: one integer per key, the theoretical arrival time (TAT) in microseconds.
-- Same decisions as the token bucket with the same emission interval and burst.
-- KEYS[1]  TAT
-- ARGV     now|'', emission_us, burst, cost
local now = clock()
local emission = int_arg(2, 'emission', 1)
local burst = int_arg(3, 'burst', 1)
local cost = int_arg(4, 'cost', 1)
local tolerance = emission * burst
if tolerance > MAX then
  fail('invalid argument burst')
end

local tat = now
local raw = redis.call('GET', KEYS[1])
if raw then
  tat = stored_int(raw, 'TAT')
  if tat < now then
    tat = now
  end
end

local function units_left(t)
  local left = math.floor((now + tolerance - t) / emission)
  if left < 0 then
    return 0
  end
  return left
end

if cost > burst then
  return { 0, units_left(tat), -1, tat - now }
end

local new_tat = tat + cost * emission
local allow_at = new_tat - tolerance
if allow_at > now then
  return { 0, units_left(tat), allow_at - now, tat - now }
end

redis.call('SET', KEYS[1], fmt(new_tat), 'PX', ms_ceil(new_tat - now))
return { 1, units_left(new_tat), 0, new_tat - now }
