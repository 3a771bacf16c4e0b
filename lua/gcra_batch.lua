-- GCRA, batch form (after gcra_core.lua; what exact batching sends for GCRA checks instead of
-- batch.lua around gcra.lua). Decides several checks in one atomic call, in the order given,
-- each exactly as its own call of gcra.lua would at the same instant: the same replies, the
-- same errors and the same state left behind. The per-check cost is what it saves: one MGET
-- reads every key up front, decisions run on a table in Lua, and one SET per key written goes
-- out at the end (instead of a GET and a SET per check, each check in a closure of its own).
-- ARGV[1]  now|'' (read once, shared by every check)
-- ARGV[2]  number of checks
-- then, per check: 2 (its key count), 3 (its argument count), cost, emission_us, burst
-- KEYS     two keys per check, in order: its TAT, then its ban (a key may come more than
--          once); a ban read by MGET that is not a string reads as no ban
-- Reply: one entry per check: gcra.lua's reply, or the message of the error its own call
-- would have got, as a string (see batch.lua).
local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'

local n = tonumber(ARGV[2])
if n == nil or n % 1 ~= 0 or n < 0 or 2 * n ~= #KEYS or #ARGV ~= 2 + 5 * n then
  return redis.error_reply('ERR tower-redis-ratelimit: batch arguments out of range')
end
if n == 0 then
  return {}
end

-- The time, read by the first check (an explicit time that is not one: nil, and every check
-- fails as its own call would).
local now = ARGV[1]

-- Each key's stored TAT: as MGET found it (false when it found nothing: no key, or one that
-- is not a string, told apart when it matters, below), then what the batch's checks wrote.
local tats = {}
local fresh = {} -- keys MGET found nothing under
local bans = {}
local raws = redis.call('MGET', unpack(KEYS))
for i = 1, n do
  local key = KEYS[2 * i - 1]
  if tats[key] == nil then
    tats[key] = raws[2 * i - 1]
    if not raws[2 * i - 1] then
      fresh[key] = true
    end
  end
  bans[i] = raws[2 * i]
end

local replies = {}
local written = {} -- keys to write, in the order first written
local probe = {} -- fresh keys decided without a write: a wrong type must still be an error
for i = 1, n do
  local a = 5 * i - 2 -- ARGV[a] = key count, ARGV[a + 1] = argument count
  if ARGV[a] ~= '2' or ARGV[a + 1] ~= '3' then
    return redis.error_reply('ERR tower-redis-ratelimit: batch arguments out of range')
  end
  local key = KEYS[2 * i - 1]
  local cost, emission, burst = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local tat, available, wait
  now, tat, available, wait = gcra(now, cost, emission, burst, key, tats[key])
  local ban = bans[i] and tonumber(bans[i])
  if tat and bans[i] and (ban == nil or ban % 1 ~= 0 or ban < 0 or ban > 4503599627370496) then
    tat, available = nil, 'ERR tower-redis-ratelimit: corrupted ban under ' .. KEYS[2 * i]
  end
  if not tat then
    replies[i] = available -- the error's message
  elseif ban and ban > now then
    replies[i] = { 2, 0, ban - now, ban - now }
    if fresh[key] then
      probe[key] = true
    end
  elseif wait ~= 0 then
    replies[i] = { 0, available, wait, tat - now }
    if fresh[key] then
      probe[key] = true
    end
  else
    if written[key] == nil then
      written[key] = true
      written[#written + 1] = key
    end
    tat = tat + cost * emission
    tats[key] = tat
    replies[i] = { 1, available - cost, 0, tat - now, now }
  end
end

-- A key MGET found nothing under but that exists holds another type: every check of it that
-- got past its arguments fails as its own call would have at its GET, and nothing is written.
local function wrong_type(key)
  for i = 1, n do
    if KEYS[2 * i - 1] == key and type(replies[i]) == 'table' then
      replies[i] = WRONGTYPE
    end
  end
end

for _, key in ipairs(written) do
  local tat = tats[key]
  local px = string.format('%d', math.ceil((tat - now) / 1000))
  if fresh[key] then
    if not redis.call('SET', key, string.format('%d', tat), 'PX', px, 'NX') then
      wrong_type(key)
    end
  else
    redis.call('SET', key, string.format('%d', tat), 'PX', px)
  end
end
for key in pairs(probe) do
  if not written[key] and redis.call('EXISTS', key) == 1 then
    wrong_type(key)
  end
end
return replies
