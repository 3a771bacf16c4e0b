-- Settlements (after the prelude): an admitted check's charge (its estimate, `cost`) settled
-- after the fact to the units the request used (`actual`). Below the charge, the difference
-- is given back as a refund gives (at most what the charge still holds); above it, the
-- difference is charged at the time of the settlement whatever the limit: a debt that the
-- key's next checks wait out. The in-memory twin is src/algorithm/settle.rs and each
-- algorithm's `settle`.

-- How many full quotas a GCRA or token-bucket key may owe (DEBT_QUOTAS in settle.rs).
local DEBT_QUOTAS = 100

-- A bucket's time `base` (never before `now`) moved on by `excess` units of `emission`, but
-- never past DEBT_QUOTAS bursts (`tolerance` each) beyond a key with nothing left, nor past
-- 2^52. A product or sum past 2^53 is not exact in Lua's doubles, but rounds to a number past
-- the cap all the same, so the result is exact.
local function bucket_charged(base, now, emission, tolerance, excess)
  local cap = now + tolerance * (DEBT_QUOTAS + 1)
  if cap > MAX then
    cap = MAX
  end
  local moved = base + excess * emission
  if moved > cap then
    moved = cap
  end
  if moved < base then
    moved = base
  end
  return moved
end
