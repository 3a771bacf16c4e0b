-- Refund for GCRA and for several GCRA limits on one key (after prelude.lua, refund_ledger.lua
-- and gcra_state.lua): gives back what an admitted check's
-- charge still holds of each limit's TAT (see refund_ledger.lua), moving it back by that much,
-- never before now (a rested key holds no more than its burst). A TAT already in the past, or
-- a missing key, has nothing to give back.
-- KEYS[i]      TAT of limit i (n limits; GCRA's, which may hold a ban's copy that stays, see
--              keys.rs); KEYS[n + i] its refund ledger; then, optionally, a marker key (see
--              `first_run` in prelude.lua)
-- ARGV         now|'', cost, emission_us and burst of each limit, when the check was admitted,
--              then the TAT the check left of each limit
-- Reply        1 when units were given back, 0 otherwise
local now = clock()
local cost = int_arg(2, 'cost', 1)
local n = (#ARGV - 3) / 3
if n < 1 or n % 1 ~= 0 or (#KEYS ~= 2 * n and #KEYS ~= 2 * n + 1) then
  fail('invalid argument count')
end
local at = int_arg(3 + 2 * n, 'admission time', 0)
local span, ends = {}, {}
for i = 1, n do
  local emission = int_arg(1 + 2 * i, 'emission', 1)
  local burst = int_arg(2 + 2 * i, 'burst', 1)
  if emission * burst > MAX then
    fail('invalid argument burst')
  end
  ends[i] = int_arg(3 + 2 * n + i, 'end', 0)
  -- An admitted check cost at most the burst.
  span[i] = emission * math.min(cost, burst)
end
if not first_run(2 * n) then
  return 0
end
local given = 0
for i = 1, n do
  local raw = redis.call('GET', KEYS[i])
  if raw then
    local tat, ban = gcra_state(raw, KEYS[i])
    if tat > now then
      local ledger = ledger_read(KEYS[n + i], now)
      local back, moved, noted = ledger_give_back(tat, ledger, now, at, ends[i], span[i])
      if moved then
        gcra_write(KEYS[i], back, ban, now)
        given = 1
      end
      if noted then
        ledger_write(KEYS[n + i], ledger, now)
      end
    end
  end
end
return given
