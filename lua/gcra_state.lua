-- A GCRA state as stored (after the prelude; see keys.rs): the TAT, or `TAT:BAN` while the key
-- holds a copy of its ban (BAN: when the ban ends), so that a check reads one key. For the
-- scripts that read or write a GCRA state but its check (gcra.lua and gcra_batch.lua read it
-- inline): its peek, its refund, a ban.

-- The TAT and the ban's end (0: none) stored under `key`, as read (`raw`); anything else is an
-- error naming the key.
local function gcra_state(raw, key)
  local tat, ban = tonumber(raw), 0
  if tat == nil then
    local at, ends = string.match(raw, '^(%d+):(%d+)$')
    tat, ban = tonumber(at), tonumber(ends)
  end
  if tat == nil or tat ~= tat or tat % 1 ~= 0 or tat < 0 or tat > MAX or ban == nil
      or ban > MAX then
    fail('corrupted TAT under ' .. key)
  end
  return tat, ban
end

-- Writes the GCRA state `tat` (nil: rested) to `key` at `now`, with the copy of a ban in force
-- until `ban`; deletes the key when neither matters any more.
local function gcra_write(key, tat, ban, now)
  local value, lives = nil, 0
  if tat and tat > now then
    value, lives = fmt(tat), tat - now
  end
  if ban > now then
    value = (value or '0') .. ':' .. fmt(ban)
    if ban - now > lives then
      lives = ban - now
    end
  end
  if value then
    redis.call('SET', key, value, 'PX', ms_ceil(lives))
  else
    redis.call('DEL', key)
  end
end
