-- Refund for GCRA and for several GCRA limits on one key: gives back what an admitted check
-- took, as if it had never happened. Each limit's TAT moves back by cost * emission, never
-- before now (a rested key holds no more than its burst); a TAT already in the past, or a
-- missing key, has nothing to give back.
-- KEYS[i]  TAT of limit i; then, optionally, a marker key (see `first_run` in prelude.lua)
-- ARGV     now|'', cost, then emission_us, burst for each limit
-- Reply    1 when units were given back, 0 otherwise
local now = clock()
local cost = int_arg(2, 'cost', 1)
local n = (#ARGV - 2) / 2
if n < 1 or n % 1 ~= 0 or (#KEYS ~= n and #KEYS ~= n + 1) then
  fail('invalid argument count')
end
local emission, back = {}, {}
for i = 1, n do
  emission[i] = int_arg(1 + 2 * i, 'emission', 1)
  local burst = int_arg(2 + 2 * i, 'burst', 1)
  if emission[i] * burst > MAX then
    fail('invalid argument burst')
  end
  -- An admitted check cost at most the burst.
  back[i] = emission[i] * math.min(cost, burst)
end
if not first_run(n) then
  return 0
end
local given = 0
for i = 1, n do
  local raw = redis.call('GET', KEYS[i])
  if raw then
    local tat = stored_int(raw, 'TAT')
    if tat > now then
      tat = tat - back[i]
      if tat > now then
        redis.call('SET', KEYS[i], fmt(tat), 'PX', ms_ceil(tat - now))
      else
        redis.call('DEL', KEYS[i])
      end
      given = 1
    end
  end
end
return given
