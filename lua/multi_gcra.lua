-- Several GCRA limits on one key, decided together (after gcra_core.lua): the request is
-- admitted only if every limit admits it, and then takes its cost from all of them (each its
-- own cost, for budgets); if any
-- limit refuses, nothing is taken from any. One TAT per limit; all keys share the caller's
-- hash tag.
-- KEYS[i]  TAT of limit i; the last key: the key's ban (see gcra.lua)
-- ARGV     now|'', cost, then emission_us, burst for each limit; then, for budgets (each limit
--          with its own cost), what the request costs each limit (else `cost`, for all)
-- Reply: the shared 4 integers for the binding limit (denied: the longest wait; allowed: the
-- fewest units left), its 0-based index, then remaining, retry_after_us (0 = this limit would
-- admit, -1 = never), reset_after_us for each limit; when admitted, then `now` (each limit's
-- charge lies just before now + its reset_after_us, which a refund needs). While the key is
-- banned: {2, 0, left_us, left_us}, nothing taken.
local n = #KEYS - 1
if n < 1 or (#ARGV ~= 2 + 2 * n and #ARGV ~= 2 + 3 * n) then
  return redis.error_reply('ERR tower-redis-ratelimit: invalid argument count')
end
local now, costs = ARGV[1], {}
local emission, burst = {}, {}
-- Every limit's arguments first, before anything is read.
for i = 1, n do
  emission[i], burst[i] = tonumber(ARGV[1 + 2 * i]), tonumber(ARGV[2 + 2 * i])
  costs[i] = tonumber(ARGV[#ARGV == 2 + 2 * n and 2 or 2 + 2 * n + i])
  local checked, valid, bad = gcra(now, costs[i], emission[i], burst[i], KEYS[i], false)
  if not valid then
    return redis.error_reply(bad)
  end
  now = checked
end

local ban = redis.call('GET', KEYS[n + 1])
if ban then
  ban = tonumber(ban)
  if ban == nil or ban % 1 ~= 0 or ban < 0 or ban > 4503599627370496 then
    return redis.error_reply('ERR tower-redis-ratelimit: corrupted ban under ' .. KEYS[n + 1])
  elseif ban > now then
    return { 2, 0, ban - now, ban - now }
  end
end

local tat, remaining, retry = {}, {}, {}
local allowed = true
for i = 1, n do
  local _, t, left, wait = gcra(now, costs[i], emission[i], burst[i], KEYS[i])
  if not t then
    return redis.error_reply(left) -- the error's message
  end
  tat[i], remaining[i], retry[i] = t, left, wait
  if wait ~= 0 then
    allowed = false
  end
end

local reset = {}
for i = 1, n do
  if allowed then
    tat[i] = tat[i] + costs[i] * emission[i]
    remaining[i] = remaining[i] - costs[i]
    redis.call('SET', KEYS[i], string.format('%d', tat[i]), 'PX',
      string.format('%d', math.ceil((tat[i] - now) / 1000)))
  end
  reset[i] = tat[i] - now
end

local b = 1
for i = 2, n do
  if allowed then
    if remaining[i] < remaining[b] then
      b = i
    end
  elseif retry[b] ~= -1 and (retry[i] == -1 or retry[i] > retry[b]) then
    b = i
  end
end

local reply = { allowed and 1 or 0, remaining[b], allowed and 0 or retry[b], reset[b], b - 1 }
for i = 1, n do
  reply[#reply + 1] = remaining[i]
  reply[#reply + 1] = retry[i]
  reply[#reply + 1] = reset[i]
end
if allowed then
  reply[#reply + 1] = now
end
return reply
