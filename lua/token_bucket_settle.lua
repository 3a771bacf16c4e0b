-- Token bucket, a settlement (after prelude.lua, refund_ledger.lua and settle.lua): an
-- admitted check's charge of `cost` settled to `actual` units. Below the charge, what the
-- charge still holds of its last `cost - actual` units is given back, as
-- token_bucket_refund.lua gives back all of it; above it, `actual - cost` more tokens are
-- taken: those the bucket has, and beyond them a debt (capped: see settle.lua): no token
-- left, and the credit time moved ahead of now so that the bucket is full again that much
-- later.
-- KEYS[1]  the bucket hash; KEYS[2] its refund ledger; KEYS[3], optionally, a marker key (see
--          `first_run` in prelude.lua)
-- ARGV     now|'', cost, emission_us, burst, actual, when the check was admitted, when the
--          check left the bucket full again (0 and 0 when settling up: unread)
-- Reply    1 when the state changed, 0 otherwise
local now, emission, burst, cost, tolerance = bucket_args()
local actual = int_arg(5, 'actual', 0)
local at = int_arg(6, 'admission time', 0)
local end_at = int_arg(7, 'end', 0)
if actual == cost or not first_run(2) then
  return 0
end

if actual > cost then
  local tokens, ts = stored_bucket(now, emission, burst)
  local excess = actual - cost
  if tokens >= excess then
    tokens = tokens - excess
  else
    local full_at = bucket_charged(ts + (burst - tokens) * emission, now, emission, tolerance, excess)
    tokens, ts = 0, full_at - tolerance
  end
  redis.call('HSET', KEYS[1], 'n', fmt(tokens), 't', fmt(ts))
  redis.call('PEXPIRE', KEYS[1], ms_ceil(ts + (burst - tokens) * emission - now))
  return 1
end

local st = redis.call('HMGET', KEYS[1], 'n', 't')
if not (st[1] or st[2]) then
  return 0
end
local tokens, ts, t_eff = credit(
  stored_int(st[1], 'token count'), stored_int(st[2], 'timestamp'), now, emission, burst)
if tokens >= burst then
  return 0
end
local full_at = ts + (burst - tokens) * emission
local ledger = ledger_read(KEYS[2], now)
local back, moved, noted = ledger_give_back(full_at, ledger, t_eff, at, end_at,
  emission * math.min(cost, burst), emission * math.min(cost - actual, burst))
if noted then
  ledger_write(KEYS[2], ledger, now)
end
if not moved then
  return 0
end
if not back then
  redis.call('DEL', KEYS[1])
  return 1
end
local missing = math.ceil((back - t_eff) / emission)
redis.call('HSET', KEYS[1], 'n', fmt(burst - missing), 't', fmt(back - missing * emission))
redis.call('PEXPIRE', KEYS[1], ms_ceil(back - now))
return 1
