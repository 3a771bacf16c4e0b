-- GCRA, a reservation for a unit lease (after gcra_core.lua): takes up to `up_to` units at
-- once, whatever the key has available, at least `cost`; else denies exactly as gcra.lua
-- would deny a check of `cost`. The TAT moves by granted * emission, as if `granted` checks
-- of one unit had run.
-- KEYS[1]  TAT
-- ARGV     now|'', cost, emission_us, burst, up_to
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us, granted};
--          when granted, then `now` (the units lie just before now + reset_after_us)
local cost, emission, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local up_to = tonumber(ARGV[5])
local now, bad = gcra_args(ARGV[1], cost, emission, burst)
if not bad and (up_to == nil or up_to % 1 ~= 0 or up_to < 1 or up_to > MAX) then
  bad = 'up_to'
end
if bad then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument ' .. bad)
end

local tat, available, wait = gcra_at(redis.call('GET', KEYS[1]), now, cost, emission, burst)
if not tat then
  return redis.error_reply('ERR tower-redis-ratelimit: corrupted TAT under ' .. KEYS[1])
end
if wait ~= 0 then
  return { 0, available, wait, tat - now, 0 }
end

local granted = math.max(cost, math.min(up_to, available))
tat = tat + granted * emission
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX',
  string.format('%d', math.ceil((tat - now) / 1000)))
return { 1, available - granted, 0, tat - now, granted, now }
