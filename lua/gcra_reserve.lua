-- GCRA, a reservation for a unit lease (after gcra_core.lua): takes up to `up_to` units at
-- once, whatever the key has available, at least `cost`; else denies exactly as gcra.lua
-- would deny a check of `cost`. The TAT moves by granted * emission, as if `granted` checks
-- of one unit had run.
-- KEYS[1]  TAT
-- KEYS[2]  (optional) the key's ban (see gcra.lua)
-- ARGV     now|'', cost, emission_us, burst, up_to
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us, granted};
--          when granted, then `now` (the units lie just before now + reset_after_us);
--          {2, 0, left_us, left_us, 0} while the key is banned
local cost, emission, up_to = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
if up_to == nil or up_to % 1 ~= 0 or up_to < 1 or up_to > 4503599627370496 then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument up_to')
end
local now, tat, available, wait = gcra(ARGV[1], cost, emission, tonumber(ARGV[4]), KEYS[1])
if not tat then
  return redis.error_reply(available) -- the error's message
end
local ban = KEYS[2] and redis.call('GET', KEYS[2])
if ban then
  ban = tonumber(ban)
  if ban == nil or ban % 1 ~= 0 or ban < 0 or ban > 4503599627370496 then
    return redis.error_reply('ERR tower-redis-ratelimit: corrupted ban under ' .. KEYS[2])
  elseif ban > now then
    return { 2, 0, ban - now, ban - now, 0 }
  end
end
if wait ~= 0 then
  return { 0, available, wait, tat - now, 0 }
end

local granted = math.max(cost, math.min(up_to, available))
tat = tat + granted * emission
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX',
  string.format('%d', math.ceil((tat - now) / 1000)))
return { 1, available - granted, 0, tat - now, granted, now }
