-- The ledger of a GCRA or token-bucket key's refunds, for the refund scripts (after the
-- prelude). The in-memory twin is src/algorithm/held.rs, where the reasoning is written out.
--
-- A key's time (GCRA's TAT; for the token bucket, when the bucket would be full again) is a
-- queue of charges. A charge admitted at `at` that left the time at `end` and took `span` of
-- it lies on [end - span, end]; a refund at `now` gives back only the part after `now`, what
-- the charge still holds. A refund that moved the time back moved the charges admitted after
-- the refunded one too, so their `end` runs late: the ledger records such refunds ({at,
-- moved_at, back, until}: the refunded charge's admission, the refund's time, how far the time
-- moved, the time before, by which every charge it moved has drained), and a refund takes the
-- moves of the refunds of earlier charges made while its own charge was in flight off its
-- `end`. At most LEDGER_RECORDS records: beyond them the two oldest merge into one that
-- bounds both, so the estimate of a charge's end is never late and a refund never gives back
-- more than its charge holds. `floor`: every charge admitted before it has drained. `until`:
-- when the ledger may be forgotten (its key expires then).
--
-- Stored as one string of integers: 'until floor', then 'at moved_at back until' per record,
-- in the order written.
local LEDGER_RECORDS = 16

-- The ledger under `key`; an empty one if there is none, or if it may be forgotten by `now`.
local function ledger_read(key, now)
  local l = { until_at = 0, floor = 0, records = {} }
  local raw = redis.call('GET', key)
  if not raw then
    return l
  end
  local n, bad = {}, false
  for word in string.gmatch(raw, '%S+') do
    local v = tonumber(word)
    if v == nil or v ~= v or v % 1 ~= 0 or v < 0 or v > MAX then
      bad = true
    end
    n[#n + 1] = v
  end
  if bad or #n < 2 or (#n - 2) % 4 ~= 0 or (#n - 2) / 4 > LEDGER_RECORDS then
    fail('corrupted refund ledger under ' .. key)
  end
  if n[1] <= now then
    return l
  end
  l.until_at, l.floor = n[1], n[2]
  for i = 3, #n, 4 do
    l.records[#l.records + 1] = { at = n[i], moved_at = n[i + 1], back = n[i + 2], until_at = n[i + 3] }
  end
  return l
end

-- Writes the ledger back, for as long as it may matter (nothing once that is over).
local function ledger_write(key, l, now)
  if l.until_at <= now then
    redis.call('DEL', key)
    return
  end
  local words = { fmt(l.until_at), fmt(l.floor) }
  for _, r in ipairs(l.records) do
    words[#words + 1] = string.format('%d %d %d %d', r.at, r.moved_at, r.back, r.until_at)
  end
  redis.call('SET', key, table.concat(words, ' '), 'PX', ms_ceil(l.until_at - now))
end

-- Forgets the records whose moved charges have all drained by `now`, raising the floor.
local function ledger_prune(l, now)
  local kept, changed = {}, false
  for _, r in ipairs(l.records) do
    if r.until_at > now then
      kept[#kept + 1] = r
    else
      changed = true
      if r.moved_at > l.floor then
        l.floor = r.moved_at
      end
    end
  end
  l.records = kept
  return changed
end

-- The earliest the charge (at, end, span) can end now.
local function ledger_earliest(l, at, end_at, span)
  local moved = 0
  for _, r in ipairs(l.records) do
    if r.at <= at and at <= r.moved_at then
      moved = moved + r.back
    end
  end
  if moved > MAX then
    moved = MAX
  end
  local e = end_at - moved
  if e < at + span then
    e = at + span
  end
  if e > end_at then
    e = end_at
  end
  return e
end

-- Gives back, on a time `tat` later than `now`, what the charge (at, end_at, span) still
-- holds, never moving the time before `now`; at most `most` of it when given (its last part,
-- as a settlement below the charge gives back). Returns the new time (nil: rested again, the
-- key goes away), whether the time moved, and whether the ledger changed (and must be
-- written).
local function ledger_give_back(tat, l, now, at, end_at, span, most)
  local noted = ledger_prune(l, now)
  local earliest
  local held = 0
  if most == nil or most > span then
    most = span
  end
  if at >= l.floor then
    earliest = ledger_earliest(l, at, end_at, span)
    held = earliest - now
    if held < 0 then
      held = 0
    elseif held > most then
      held = most
    end
  end
  if held == 0 then
    return tat, false, noted
  end
  local back = tat - held
  if back <= now then
    -- Nothing is held any more: every charge admitted before now has drained.
    if now > l.floor then
      l.floor = now
    end
    l.records = {}
    if tat > l.until_at then
      l.until_at = tat
    end
    return nil, true, true
  end
  if earliest < tat then
    -- Charges may lie after this one: they moved back by `held`.
    l.records[#l.records + 1] = { at = at, moved_at = now, back = held, until_at = tat }
    if tat > l.until_at then
      l.until_at = tat
    end
    if #l.records > LEDGER_RECORDS then
      local a, b = l.records[1], l.records[2]
      local merged = {
        at = math.min(a.at, b.at),
        moved_at = math.max(a.moved_at, b.moved_at),
        back = math.min(a.back + b.back, MAX),
        until_at = math.max(a.until_at, b.until_at),
      }
      table.remove(l.records, 1)
      l.records[1] = merged
    end
    noted = true
  end
  return back, true, noted
end
