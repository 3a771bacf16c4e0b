-- Refund for the token bucket: gives back what an admitted check's charge still holds, on the
-- bucket's equivalent of GCRA's time (when it would be full again; see refund_ledger.lua), as
-- GCRA's refund does: the tokens of the time given back, the credit time moved with it, never
-- above the burst. A missing key is a full bucket: nothing to give. A bucket full again goes
-- away, as a rested one does.
-- KEYS[1]  the bucket hash; KEYS[2] its refund ledger; KEYS[3], optionally, a marker key (see
--          `first_run` in prelude.lua)
-- ARGV     now|'', cost, emission_us, burst, when the check was admitted, when the check left
--          the bucket full again
-- Reply    1 when tokens were given back, 0 otherwise
local now, emission, burst, cost, tolerance = bucket_args()
local at = int_arg(5, 'admission time', 0)
local end_at = int_arg(6, 'end', 0)

if not first_run(2) then
  return 0
end
local st = redis.call('HMGET', KEYS[1], 'n', 't')
if not (st[1] or st[2]) then
  return 0
end
-- Credited exactly as a check credits it; measured from t_eff (now, or the stored time if the
-- clock went backwards).
local tokens, ts, t_eff = credit(
  stored_int(st[1], 'token count'), stored_int(st[2], 'timestamp'), now, emission, burst)
if tokens >= burst then
  return 0
end

local full_at = ts + (burst - tokens) * emission
local ledger = ledger_read(KEYS[2], now)
local back, moved, noted = ledger_give_back(
  full_at, ledger, t_eff, at, end_at, emission * math.min(cost, burst))
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
