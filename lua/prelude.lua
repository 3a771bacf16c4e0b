-- tower-redis-ratelimit: shared prelude, prepended to every script but GCRA's reservation and
-- the multi-limit (they have gcra_core.lua instead: fewer functions made per call) and GCRA's
-- check and its batch form (gcra.lua, gcra_batch.lua: they stand alone, with a wire format of
-- their own, see gcra.lua).
--
-- Conventions for every other script:
--   * ARGV[1] is an explicit time in microseconds, or '' to use the server clock (TIME).
--     The explicit form exists for tests and simulations only.
--   * ARGV[2] is the cost, then come the algorithm's parameters, then what the call adds (a
--     reservation's most units; where a refunded charge lies), in the same order in the
--     check, the reservation and the refund of each algorithm.
--   * Every other argument is a positive integer; all are validated here, before any write.
--   * All arithmetic stays on integers below 2^52, where Lua's doubles are exact.
--   * The reply is {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us};
--     a check of a banned key answers {2, 0, left_us, left_us} and takes nothing. The ban's
--     key comes last in KEYS; the limiters always give it, a script called without it
--     reads no ban.
local MAX = 4503599627370496 -- 2^52

-- Raises the script's own error as a string, without Lua's position (level 0): Redis 7 and
-- later answer `ERR tower-redis-ratelimit: …`, Redis 5 and 6 the same message after their
-- `Error running script (…): @user_script:LINE: ` (they cannot raise a table: `error({err =
-- …})` comes back as a Lua error about concatenating a table). src/error.rs reads both.
local function fail(msg)
  error('tower-redis-ratelimit: ' .. msg, 0)
end

local function int_arg(i, name, min)
  local v = tonumber(ARGV[i])
  if v == nil or v ~= v or v % 1 ~= 0 or v < min or v > MAX then
    fail('invalid argument ' .. name)
  end
  return v
end

local function clock()
  if ARGV[1] == nil or ARGV[1] == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return int_arg(1, 'now', 0)
end

-- A stored integer; anything else means the key holds foreign or corrupted data.
local function stored_int(v, what)
  local n = tonumber(v)
  if n == nil or n ~= n or n % 1 ~= 0 or n < 0 or n > MAX then
    fail('corrupted ' .. what .. ' under ' .. KEYS[1])
  end
  return n
end

-- The time left at `now` of the ban under `key` (its end in microseconds, see keys.rs), or 0
-- when the key is not banned or no ban key was given (a caller of the script's own).
-- The time a ban of stored value `ban` (false: none) has left at `now`.
local function ban_left_of(ban, now)
  if not ban then
    return 0
  end
  ban = stored_int(ban, 'ban')
  if ban > now then
    return ban - now
  end
  return 0
end

local function ban_left(key, now)
  if key == nil then
    return 0
  end
  return ban_left_of(redis.call('GET', key), now)
end

local function fmt(n)
  return string.format('%d', n)
end

-- Whole milliseconds, rounded up: a key must outlive the state it holds.
local function ms_ceil(us)
  return fmt(math.ceil(us / 1000))
end

-- A sliding-window log member: 'TOTAL:SEQ' (see sliding_window.lua).
local function member(total, seq)
  return string.format('%016d:%d', total, seq)
end

local function member_total(m)
  return stored_int(string.sub(m, 1, 16), 'log member')
end

local function member_seq(m)
  if string.sub(m, 17, 17) ~= ':' then
    fail('corrupted log member under ' .. KEYS[1])
  end
  return stored_int(string.sub(m, 18), 'log member')
end

-- Whether this is the first run of a refund. A client may send a call again after it ran
-- (the cluster client resends a call whose connection was cut); a refund that gives back
-- what it finds must not run twice. When a marker key follows the `nkeys` keys of the
-- state, the first run sets it (for 30 s, longer than any resend) and a second finds it.
local function first_run(nkeys)
  if #KEYS <= nkeys then
    return true
  end
  return redis.call('SET', KEYS[nkeys + 1], '1', 'NX', 'PX', 30000) ~= false
end

-- The leading arguments of a token-bucket script (ARGV: now|'', cost, emission_us, burst): the
-- time, the emission interval, the burst, the cost and the tolerance (emission * burst, which
-- must stay below 2^52).
local function bucket_args()
  local now = clock()
  local emission = int_arg(3, 'emission', 1)
  local burst = int_arg(4, 'burst', 1)
  local cost = int_arg(2, 'cost', 1)
  local tolerance = emission * burst
  if tolerance > MAX then
    fail('invalid argument burst')
  end
  return now, emission, burst, cost, tolerance
end

-- A token bucket (see token_bucket.lua) credited up to `now` with the whole tokens earned
-- since `ts`: the tokens, the time the last whole token was credited, and the time waits are
-- measured from (`now`, or the stored time if the clock went backwards, crediting nothing).
local function credit(tokens, ts, now, emission, burst)
  if tokens > burst then
    tokens = burst -- the burst was lowered since this key was written
  end
  local t_eff = now
  if ts > now then
    t_eff = ts
  end
  local elapsed = t_eff - ts
  if elapsed >= emission * burst then
    return burst, t_eff, t_eff
  end
  local add = math.floor(elapsed / emission)
  tokens = tokens + add
  if tokens >= burst then
    return burst, t_eff, t_eff
  end
  return tokens, ts + add * emission, t_eff
end

-- The bucket under KEYS[1] (a missing key is a full bucket) credited up to `now` (see
-- `credit`): the tokens, the time the last whole token was credited, and the time waits are
-- measured from.
local function stored_bucket(now, emission, burst)
  local tokens, ts = burst, now
  local st = redis.call('HMGET', KEYS[1], 'n', 't')
  if st[1] or st[2] then
    tokens = stored_int(st[1], 'token count')
    ts = stored_int(st[2], 'timestamp')
  end
  return credit(tokens, ts, now, emission, burst)
end

-- Time from `now` until a bucket credited as above holds `want` whole tokens.
local function bucket_wait(tokens, ts, t_eff, now, emission, want)
  if tokens >= want then
    return 0
  end
  return (want - tokens) * emission - (t_eff - ts) + (t_eff - now)
end
