-- Budgets (several GCRA limits on one key, each with its own cost: see multi_gcra.lua), a
-- settlement (after prelude.lua, refund_ledger.lua, gcra_state.lua and settle.lua): each
-- limit's charge of `cost` settled to `actual` units, in one call. Below its cost, what the
-- charge still holds of the limit's last `cost - actual` units is given back, as
-- gcra_settle.lua gives back; above it, the limit's TAT moves on by `actual - cost` emission
-- intervals from now or the TAT, whatever the tolerance (a debt, capped: see settle.lua); a
-- limit settled to its cost stays as it is. A refund settles every limit to 0. The in-memory
-- twin is `MultiLimit::settle_parts` (src/algorithm/multi.rs).
-- KEYS[i]      TAT of limit i (n limits); KEYS[n + i] its refund ledger; then, optionally, a
--              marker key (see `first_run` in prelude.lua)
-- ARGV         now|'', when the check was admitted (0 when no limit settles down: unread),
--              then for each limit: emission_us, burst, cost, actual, the TAT the check left
--              (0 when unread)
-- Reply        1 when some limit's state changed, 0 otherwise
local now = clock()
local n = (#ARGV - 2) / 5
if n < 1 or n % 1 ~= 0 or (#KEYS ~= 2 * n and #KEYS ~= 2 * n + 1) then
  fail('invalid argument count')
end
local at = int_arg(2, 'admission time', 0)
local emission, burst, cost, actual, ends = {}, {}, {}, {}, {}
for i = 1, n do
  local base = 2 + 5 * (i - 1)
  emission[i] = int_arg(base + 1, 'emission', 1)
  burst[i] = int_arg(base + 2, 'burst', 1)
  if emission[i] * burst[i] > MAX then
    fail('invalid argument burst')
  end
  cost[i] = int_arg(base + 3, 'cost', 1)
  actual[i] = int_arg(base + 4, 'actual', 0)
  ends[i] = int_arg(base + 5, 'end', 0)
end
if not first_run(2 * n) then
  return 0
end
local changed = 0
for i = 1, n do
  if actual[i] ~= cost[i] then
    local raw = redis.call('GET', KEYS[i])
    local tat, ban = now, 0
    if raw then
      tat, ban = gcra_state(raw, KEYS[i])
    end
    if actual[i] > cost[i] then
      if tat < now then
        tat = now
      end
      local tolerance = emission[i] * burst[i]
      gcra_write(KEYS[i], bucket_charged(tat, now, emission[i], tolerance, actual[i] - cost[i]),
        ban, now)
      changed = 1
    elseif raw and tat > now then
      local ledger = ledger_read(KEYS[n + i], now)
      local back, moved, noted = ledger_give_back(tat, ledger, now, at, ends[i],
        emission[i] * math.min(cost[i], burst[i]),
        emission[i] * math.min(cost[i] - actual[i], burst[i]))
      if moved then
        gcra_write(KEYS[i], back, ban, now)
        changed = 1
      end
      if noted then
        ledger_write(KEYS[n + i], ledger, now)
      end
    end
  end
end
return changed
