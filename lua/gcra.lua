-- GCRA, one check (after gcra_core.lua). The hottest script: one GET, at most one SET.
-- KEYS[1]  TAT
-- KEYS[2]  (optional) the key's ban: when it ends, in microseconds (see keys.rs)
-- ARGV     now|'', cost, emission_us, burst
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us}; when
--          admitted, then `now`: the charge lies just before now + reset_after_us, which a
--          refund needs (see refund_ledger.lua); {2, 0, left_us, left_us} while the key is
--          banned (nothing taken)
local cost, emission = tonumber(ARGV[2]), tonumber(ARGV[3])
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
    return { 2, 0, ban - now, ban - now }
  end
end
if wait ~= 0 then
  return { 0, available, wait, tat - now }
end

tat = tat + cost * emission
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX',
  string.format('%d', math.ceil((tat - now) / 1000)))
return { 1, available - cost, 0, tat - now, now }
