
-- Batch driver, appended after an algorithm wrapped as `decide()`, which reads the local
-- `KEYS` and `ARGV` that this driver points at one check's slice at a time. Decides several
-- checks in one atomic call, in the order given, each exactly as its own call would at the
-- same instant.
-- ARGV[1]  now|'' (read once, shared by every check)
-- ARGV[2]  number of checks
-- then, per check: its key count, its argument count, its arguments (those after `now`)
-- KEYS     every check's keys, in order
-- Reply: one entry per check: the algorithm's reply (an array), or the message of an error that
-- concerns that check alone, as a string (not as a nested error reply, which clients may take
-- as the whole call failing). A check that fails leaves behind what its own call would have:
-- the scripts validate their arguments before writing.
local ALL_KEYS, ALL_ARGV = KEYS, ARGV

local function count_arg(i, name)
  local v = tonumber(ALL_ARGV[i])
  if v == nil or v ~= v or v % 1 ~= 0 or v < 0 or v > 1000000 then
    error('tower-redis-ratelimit: invalid batch argument ' .. name, 0)
  end
  return v
end

local now = ALL_ARGV[1]
if now == nil or now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local n = count_arg(2, 'count')
local replies = {}
local ki, ai = 1, 3
for c = 1, n do
  local nk, na = count_arg(ai, 'key count'), count_arg(ai + 1, 'argument count')
  ai = ai + 2
  if ki + nk - 1 > #ALL_KEYS or ai + na - 1 > #ALL_ARGV then
    error('tower-redis-ratelimit: batch arguments out of range', 0)
  end
  local keys, argv = {}, { now }
  for j = 1, nk do
    keys[j] = ALL_KEYS[ki + j - 1]
  end
  for j = 1, na do
    argv[j + 1] = ALL_ARGV[ai + j - 1]
  end
  ki, ai = ki + nk, ai + na
  KEYS, ARGV = keys, argv
  local ok, r = pcall(decide)
  if ok and type(r) ~= 'table' then
    -- Not an array (a custom script): an error for this check, never a hole in the reply.
    ok, r = false, 'ERR tower-redis-ratelimit: a check returned ' .. type(r) .. ', not an array'
  end
  if ok and not r.err then
    replies[c] = r
  else -- raised, or returned with redis.error_reply
    if type(r) == 'table' and r.err then
      r = r.err
    end
    r = tostring(r)
    if not string.match(r, '^%u+ ') then
      r = 'ERR ' .. r -- a Lua runtime error carries no code
    end
    replies[c] = r
  end
end
return replies
