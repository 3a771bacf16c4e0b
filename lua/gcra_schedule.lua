-- GCRA, a place in the key's schedule for an outbound call (after gcra_core.lua): the call
-- goes at the key's TAT (now when the key is rested), which moves on by cost * emission, so
-- callers sharing the key go one after another, in the order their calls reach this script,
-- one emission interval per unit apart and never in a burst. A place further away than
-- `budget` is not kept: nothing is written, and the reply says how far it is.
-- KEYS[1]  TAT
-- KEYS[2]  (optional) the key's ban (see gcra.lua)
-- ARGV     now|'', cost, emission_us, burst, budget_us
-- Reply    {allowed, remaining, retry_after_us, reset_after_us, wait_us}:
--          {1, units left after the call, 0, new TAT - now, wait until the place} when kept;
--          {0, units left, wait until the place, TAT - now, 0} when it is beyond the budget;
--          {0, units left, -1, TAT - now, 0} when the cost exceeds the burst (never);
--          {2, 0, left_us, left_us, 0} while the key is banned
local cost, emission = tonumber(ARGV[2]), tonumber(ARGV[3])
local budget = tonumber(ARGV[5])
if budget == nil or budget % 1 ~= 0 or budget < 0 or budget > 4503599627370496 then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument budget')
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
if wait == -1 then
  return { 0, available, -1, tat - now, 0 }
end
if tat - now > budget then
  return { 0, available, tat - now, tat - now, 0 }
end
local new_tat = tat + cost * emission
if new_tat > 4503599627370496 then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument cost')
end
local left = math.floor((now + emission * tonumber(ARGV[4]) - new_tat) / emission)
if left < 0 then
  left = 0
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX',
  string.format('%d', math.ceil((new_tat - now) / 1000)))
return { 1, left, 0, new_tat - now, tat - now }
