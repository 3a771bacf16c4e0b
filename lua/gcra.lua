-- tower-redis-ratelimit: GCRA, one check. The hottest script, so it does the least a check can:
-- TIME, one GET, at most one PSETEX, no function made per call, no number parsed but the stored
-- TAT and the time, one integer or one string back (a table reply costs the server more than
-- the rest of a denial). The crate reads the full outcome from that reply with the quota it sent
-- (src/store/redis/scripts.rs, `parse_gcra`); the in-memory twin is src/algorithm/gcra.rs
-- (`decide`), integer for integer the same maths.
--
-- A key's state is its theoretical arrival time (TAT) in microseconds: the key is rested again
-- then. A check of `cost` units moves it by cost * emission (the step) and is admitted while the
-- moved TAT stays within the tolerance (emission * burst) of now.
--
-- KEYS[1]  the key's TAT, or `TAT:BAN` while it holds a ban's copy (BAN: when the ban ends;
--          see keys.rs): the ban is read where the state is, no second key
-- ARGV[1]  the step: cost * emission_us; tolerance + 1 when the cost exceeds the burst
-- ARGV[2]  the tolerance: emission_us * burst
-- ARGV[3]  how long a rested key lives once charged: the step in ms, rounded up
-- ARGV[4]  (tests and simulations only) an explicit time in µs; without it, the server's TIME
-- Reply    admitted: the string `TAT SECS USECS`, the TAT left and the time admitted at
--          (SECS * 10^6 + USECS µs); denied: the integer now - TAT (0 or less, the time until
--          the key is rested, negated); banned: {2, 0, left_us, left_us}, nothing taken.
--
-- The arguments are not validated here: only RedisStore calls this script, and it builds them
-- from validated types (a BucketRate: 1 <= emission, 1 <= burst, emission * burst <= 2^52; a
-- cost from 1 to 2^32 - 1, an explicit time up to 2^52: RedisStore::check refuses any other), so
-- every sum below stays under 2^53, where Lua's doubles are exact. The stored value is
-- validated: anything but a TAT (or a TAT and a ban) up to 2^52 is an error naming the key.
local t = ARGV[4] and { '0', ARGV[4] } or redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local raw = redis.call('GET', KEYS[1])
local tat = now
if raw then
  local ban = 0
  tat = tonumber(raw)
  if tat == nil then
    local at, ends = string.match(raw, '^(%d+):(%d+)$')
    tat, ban = tonumber(at), tonumber(ends)
  end
  if tat == nil or tat % 1 ~= 0 or tat < 0 or tat > 4503599627370496 or ban == nil
      or ban > 4503599627370496 then
    return redis.error_reply('ERR tower-redis-ratelimit: corrupted TAT under ' .. KEYS[1])
  elseif ban > now then
    return { 2, 0, ban - now, ban - now }
  elseif tat < now then
    tat = now
  end
end
local new = tat + ARGV[1]
if new - ARGV[2] > now then
  return now - tat
end
local px = ARGV[3]
if tat > now then
  px = string.format('%d', math.ceil((new - now) / 1000))
end
new = string.format('%d', new)
redis.call('PSETEX', KEYS[1], px, new)
return new .. ' ' .. t[1] .. ' ' .. t[2]
