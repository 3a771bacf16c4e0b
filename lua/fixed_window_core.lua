-- Fixed windows (after prelude.lua): the window a time falls in, and the state of a key.
--
-- Windows are aligned to the clock in UTC: a period of P microseconds counts from the Unix
-- epoch (a day starts at midnight UTC); calendar windows are weeks starting on Monday, months
-- and years. The same arithmetic as src/algorithm/fixed_window.rs, integer for integer.
--
-- A key's state is one string, 'ID COUNT': the units admitted in the current window, and the
-- window's id, a time inside it (its start, or the time of the reset that zeroed it), which an
-- admitted check reports so that a refund gives back only within the same window and
-- unreset. It lives until the window ends.
local DAY = 86400000000

-- Days since the epoch of a date in the proleptic Gregorian calendar (H. Hinnant's algorithm).
local function days_from_civil(y, m, d)
  if m <= 2 then
    y = y - 1
  end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

-- The year and month of a day since the epoch.
local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp + 3
  if mp >= 10 then
    m = mp - 9
  end
  local y = yoe + era * 400
  if m <= 2 then
    y = y + 1
  end
  return y, m
end

-- The start and end of the window `t` falls in: `period` microseconds from the epoch when
-- `calendar` is 0, else a week (1), a month (2) or a year (3).
local function window_of(t, period, calendar)
  if calendar == 0 then
    local start = t - t % period
    return start, start + period
  end
  local days = math.floor(t / DAY)
  if calendar == 1 then
    local monday = days - (days + 3) % 7 -- 1970-01-01 was a Thursday
    return monday * DAY, (monday + 7) * DAY
  end
  local y, m = civil_from_days(days)
  if calendar == 2 then
    local ny, nm = y, m + 1
    if nm > 12 then
      ny, nm = y + 1, 1
    end
    return days_from_civil(y, m, 1) * DAY, days_from_civil(ny, nm, 1) * DAY
  end
  return days_from_civil(y, 1, 1) * DAY, days_from_civil(y + 1, 1, 1) * DAY
end

-- The arguments of every fixed-window script (ARGV: now|'', cost, limit, period_us, calendar):
-- the time, the cost, the limit, the period and the calendar.
local function window_args()
  local now = clock()
  local cost = int_arg(2, 'cost', 1)
  local limit = int_arg(3, 'limit', 1)
  local period = int_arg(4, 'period', 0)
  local calendar = int_arg(5, 'calendar', 0)
  if calendar > 3 or (calendar == 0 and period < 1000) or (calendar > 0 and period ~= 0) then
    fail('invalid argument period')
  end
  return now, cost, limit, period, calendar
end

-- The current window at `now` and what the key holds of it (`raw`, the key's stored value,
-- false when it has none): its start, end, id and count. A state of an earlier window counts nothing; one of a later window (the clock stepped back)
-- is the current one, so that a step back never frees units.
local function window_state_of(raw, key, now, period, calendar)
  local start, finish = window_of(now, period, calendar)
  if raw then
    local sp = string.find(raw, ' ', 1, true)
    if not sp then
      fail('corrupted window under ' .. key)
    end
    local id = stored_int(string.sub(raw, 1, sp - 1), 'window')
    local count = stored_int(string.sub(raw, sp + 1), 'window count')
    if id >= start then
      if id >= finish then
        start, finish = window_of(id, period, calendar)
      end
      return start, finish, id, count
    end
  end
  return start, finish, start, 0
end

-- The same, read from `key`.
local function window_state(key, now, period, calendar)
  return window_state_of(redis.call('GET', key), key, now, period, calendar)
end
