-- tower-redis-ratelimit: the GCRA core, put before GCRA's reservation and the multi-limit
-- (gcra_reserve.lua, multi_gcra.lua), which use nothing else: no shared prelude, so they make
-- one function per call (a function is made anew on every call of a script). GCRA's check and
-- its batch form (gcra.lua, gcra_batch.lua) stand alone: the same maths, less work. The
-- in-memory twin is src/algorithm/gcra.rs.
--
-- A key's state is one integer, its theoretical arrival time (TAT) in microseconds: the time
-- at which the key is rested again. A cost of `cost` units moves it by cost * emission; the
-- key admits a cost while the moved TAT stays within the tolerance (emission * burst) of now.
-- Same decisions as the token bucket with the same emission interval and burst.
--
-- Conventions for every GCRA script (as for the others, see prelude.lua): ARGV[1] is an
-- explicit time in microseconds or '' for the server clock (TIME); then the cost, then the
-- emission interval and the burst of each limit; then what the call adds (a reservation's
-- most units). Every argument is validated before any read or write; integers stay below
-- 2^52 (4503599627370496, written out: no upvalue to make per call), where Lua's doubles are
-- exact; the stored TAT is a plain integer string, or `TAT:BAN` in GCRA's state while it holds
-- a ban's copy (see keys.rs; the ban is read from the ban's own key here).

-- GCRA on one key at `now`, for a check of `cost` units under `emission` and `burst`:
-- * `now`: ARGV[1] ('' for the server's clock, read here), or a time already read;
-- * `raw`: the stored TAT as already read (false: none), or nil to read it here from `key`
--   (GET, once the arguments are checked); `key` names the key in errors.
-- Returns the time, then where the key stands: its TAT (never before now), the whole units
-- available, and the wait until `cost` units are (0: now; -1: never, the cost exceeds the
-- burst). Or, for an argument that cannot work (checked in the order now, emission, burst,
-- emission * burst below 2^52, cost) or a stored value that is not a TAT (foreign or
-- corrupted data): the time (nil if it is the wrong one), nil, and the error's message in
-- place of the units.
local function gcra(now, cost, emission, burst, key, raw)
  if now == '' then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  else
    now = tonumber(now)
    if now == nil or now % 1 ~= 0 or now < 0 or now > 4503599627370496 then
      return nil, nil, 'ERR tower-redis-ratelimit: invalid argument now'
    end
  end
  if emission == nil or emission % 1 ~= 0 or emission < 1 or emission > 4503599627370496 then
    return now, nil, 'ERR tower-redis-ratelimit: invalid argument emission'
  elseif burst == nil or burst % 1 ~= 0 or burst < 1 or emission * burst > 4503599627370496 then
    return now, nil, 'ERR tower-redis-ratelimit: invalid argument burst'
  elseif cost == nil or cost % 1 ~= 0 or cost < 1 or cost > 4503599627370496 then
    return now, nil, 'ERR tower-redis-ratelimit: invalid argument cost'
  end
  if raw == nil then
    raw = redis.call('GET', key)
  end
  local tat = now
  if raw then
    tat = tonumber(raw) or tonumber(string.match(raw, '^(%d+):%d+$'))
    if tat == nil or tat % 1 ~= 0 or tat < 0 or tat > 4503599627370496 then
      return now, nil, 'ERR tower-redis-ratelimit: corrupted TAT under ' .. key
    end
    if tat < now then
      tat = now
    end
  end
  local tolerance = emission * burst
  local available = math.floor((now + tolerance - tat) / emission)
  if available < 0 then
    available = 0
  end
  if cost > burst then
    return now, tat, available, -1
  elseif cost > available then
    return now, tat, available, tat + cost * emission - tolerance - now
  end
  return now, tat, available, 0
end
