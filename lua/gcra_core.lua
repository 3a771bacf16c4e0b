-- tower-redis-ratelimit: the GCRA core, put before every GCRA script (gcra.lua, gcra_batch.lua,
-- gcra_reserve.lua, multi_gcra.lua), which use nothing else: no shared prelude, so the
-- hottest script creates only these few functions per call. The in-memory twin is
-- src/algorithm/gcra.rs.
--
-- A key's state is one integer, its theoretical arrival time (TAT) in microseconds: the time
-- at which the key is rested again. A cost of `cost` units moves it by cost * emission; the
-- key admits a cost while the moved TAT stays within the tolerance (emission * burst) of now.
-- Same decisions as the token bucket with the same emission interval and burst.
--
-- Conventions for every GCRA script (as for the others, see prelude.lua): ARGV[1] is an
-- explicit time in microseconds or '' for the server clock (TIME); then the cost, then the
-- emission interval and the burst of each limit; then what the call adds (a reservation's
-- most units). Every argument is validated before any write; integers stay below 2^52,
-- where Lua's doubles are exact; the stored TAT is a plain integer string.
local MAX = 4503599627370496 -- 2^52, written out in the functions below (no upvalue to make
-- per call)

-- The time and the name of the first argument that cannot work (nil when all can): the time
-- (`now`: ARGV[1], '' for the server's clock, read here; or a time already read), the
-- emission interval, the burst (emission * burst, the tolerance, must stay below 2^52 too)
-- and the cost, in that order. The time is nil when it is not one.
local function gcra_args(now, cost, emission, burst)
  if now == '' then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  else
    now = tonumber(now)
    if now == nil or now % 1 ~= 0 or now < 0 or now > 4503599627370496 then
      return nil, 'now'
    end
  end
  if emission == nil or emission % 1 ~= 0 or emission < 1 or emission > 4503599627370496 then
    return now, 'emission'
  elseif burst == nil or burst % 1 ~= 0 or burst < 1 or emission * burst > 4503599627370496 then
    return now, 'burst'
  elseif cost == nil or cost % 1 ~= 0 or cost < 1 or cost > 4503599627370496 then
    return now, 'cost'
  end
  return now, nil
end

-- Where a key stands at `now`, from its stored TAT (`raw`, false or nil when there is none):
-- its TAT (never before now), the whole units available, and how long until `cost` units are
-- (0: now; -1: never, the cost exceeds the burst). A stored value that is not a TAT gives nil:
-- foreign or corrupted data, an error for the caller to report.
local function gcra_at(raw, now, cost, emission, burst)
  local tat = now
  if raw then
    tat = tonumber(raw)
    if tat == nil or tat % 1 ~= 0 or tat < 0 or tat > 4503599627370496 then
      return nil
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
    return tat, available, -1
  elseif cost > available then
    return tat, available, tat + cost * emission - tolerance - now
  end
  return tat, available, 0
end
