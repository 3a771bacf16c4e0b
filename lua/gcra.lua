-- GCRA: one integer per key, the theoretical arrival time (TAT) in microseconds.
-- Same decisions as the token bucket with the same emission interval and burst.
-- KEYS[1]  TAT
-- ARGV     now|'', emission_us, burst, cost
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us}; when
--          admitted, then `now`: the charge lies just before now + reset_after_us, which a
--          refund needs (see refund_ledger.lua)
--
-- The hottest script, so it stands alone (no shared prelude) and keeps its per-call work to
-- the minimum: no closures, one validation pass over all arguments before any write, integers
-- below 2^52 (exact in Lua's doubles), the stored TAT as a plain integer string.
local MAX = 4503599627370496 -- 2^52

local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = tonumber(now)
end
local emission, burst, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local bad
if now == nil or now % 1 ~= 0 or now < 0 or now > MAX then
  bad = 'now'
elseif emission == nil or emission % 1 ~= 0 or emission < 1 or emission > MAX then
  bad = 'emission'
elseif burst == nil or burst % 1 ~= 0 or burst < 1 or emission * burst > MAX then
  bad = 'burst'
elseif cost == nil or cost % 1 ~= 0 or cost < 1 or cost > MAX then
  bad = 'cost'
end
if bad then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument ' .. bad)
end
local tolerance = emission * burst

local tat = now
local raw = redis.call('GET', KEYS[1])
if raw then
  tat = tonumber(raw)
  if tat == nil or tat % 1 ~= 0 or tat < 0 or tat > MAX then
    return redis.error_reply('ERR tower-redis-ratelimit: corrupted TAT under ' .. KEYS[1])
  end
  if tat < now then
    tat = now
  end
end

local new_tat = tat + cost * emission
if cost > burst or new_tat - tolerance > now then
  local left = math.floor((now + tolerance - tat) / emission)
  if left < 0 then
    left = 0
  end
  local retry = -1
  if cost <= burst then
    retry = new_tat - tolerance - now
  end
  return { 0, left, retry, tat - now }
end

redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX',
  string.format('%d', math.ceil((new_tat - now) / 1000)))
return { 1, math.floor((now + tolerance - new_tat) / emission), 0, new_tat - now, now }
