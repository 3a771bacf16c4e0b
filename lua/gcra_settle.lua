-- GCRA, a settlement (after prelude.lua, refund_ledger.lua, gcra_state.lua and settle.lua):
-- an admitted check's charge of `cost` settled to `actual` units. Below the charge, what the
-- charge still holds of its last `cost - actual` units is given back, as gcra_refund.lua
-- gives back all of it; above it, the TAT moves on by `actual - cost` emission intervals from
-- now or the TAT, whatever the tolerance (a debt, capped: see settle.lua). A ban's copy in
-- the state stays.
-- KEYS[1]  the TAT (see keys.rs); KEYS[2] its refund ledger; KEYS[3], optionally, a marker key
--          (see `first_run` in prelude.lua)
-- ARGV     now|'', cost, emission_us, burst, actual, when the check was admitted, the TAT the
--          check left (0 and 0 when settling up: unread)
-- Reply    1 when the state changed, 0 otherwise
local now = clock()
local cost = int_arg(2, 'cost', 1)
local emission = int_arg(3, 'emission', 1)
local burst = int_arg(4, 'burst', 1)
if emission * burst > MAX then
  fail('invalid argument burst')
end
local actual = int_arg(5, 'actual', 0)
local at = int_arg(6, 'admission time', 0)
local end_at = int_arg(7, 'end', 0)
if actual == cost or not first_run(2) then
  return 0
end
local raw = redis.call('GET', KEYS[1])
local tat, ban = now, 0
if raw then
  tat, ban = gcra_state(raw, KEYS[1])
end
if actual > cost then
  if tat < now then
    tat = now
  end
  gcra_write(KEYS[1], bucket_charged(tat, now, emission, emission * burst, actual - cost), ban, now)
  return 1
end
if not raw or tat <= now then
  return 0
end
local ledger = ledger_read(KEYS[2], now)
local back, moved, noted = ledger_give_back(tat, ledger, now, at, end_at,
  emission * math.min(cost, burst), emission * math.min(cost - actual, burst))
if moved then
  gcra_write(KEYS[1], back, ban, now)
end
if noted then
  ledger_write(KEYS[2], ledger, now)
end
if moved then
  return 1
end
return 0
