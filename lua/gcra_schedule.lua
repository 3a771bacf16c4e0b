-- GCRA, a place in the key's schedule (after gcra_core.lua), paced one of two ways:
-- * steady (pace 0), an outbound call's: the call goes at the key's TAT (now when the key is
--   rested), so callers sharing the key go one after another, in the order their calls reach
--   this script, one emission interval per unit apart and never in a burst;
-- * burst (pace 1), an inbound request's delay: the call goes when a check of its cost would
--   be admitted (at once within the burst, else when its units come).
-- Either way the TAT moves on by cost * emission. A place further away than `budget` is not
-- kept: nothing is written, and the reply says how far it is.
-- KEYS[1]  TAT
-- KEYS[2]  (optional) the key's ban (see gcra.lua)
-- ARGV     now|'', cost, emission_us, burst, budget_us, pace (0|1)
-- Reply    {allowed, remaining, retry_after_us, reset_after_us, wait_us}, and when kept `now`:
--          {1, units left after the call, 0, new TAT - now, wait until the place, now} when
--          kept (the units lie just before now + reset_after_us, as a check's);
--          {0, units left, wait until the place, TAT - now, 0} when it is beyond the budget;
--          {0, units left, -1, TAT - now, 0} when the cost exceeds the burst (never);
--          {2, 0, left_us, left_us, 0} while the key is banned
local cost, emission = tonumber(ARGV[2]), tonumber(ARGV[3])
local budget, pace = tonumber(ARGV[5]), ARGV[6]
if budget == nil or budget % 1 ~= 0 or budget < 0 or budget > 4503599627370496 then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument budget')
elseif pace ~= '0' and pace ~= '1' then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument pace')
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
local new_tat = tat + cost * emission
if new_tat > 4503599627370496 then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument cost')
end
local place = tat - now
if pace == '1' then
  place = math.max(0, new_tat - emission * tonumber(ARGV[4]) - now)
end
if place > budget then
  return { 0, available, place, tat - now, 0 }
end
local left = math.floor((now + emission * tonumber(ARGV[4]) - new_tat) / emission)
if left < 0 then
  left = 0
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX',
  string.format('%d', math.ceil((new_tat - now) / 1000)))
return { 1, left, 0, new_tat - now, place, now }
