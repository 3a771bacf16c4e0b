-- Several GCRA limits on one key, decided together: the request is admitted only if every
-- limit admits it, and then takes its cost from all of them; if any limit refuses, nothing is
-- taken from any. One integer (the TAT) per limit; all keys share the caller's hash tag.
-- KEYS[i]  TAT of limit i
-- ARGV     now|'', cost, then emission_us, burst for each limit
-- Reply: the shared 4 integers for the binding limit (denied: the longest wait; allowed: the
-- fewest units left), its 0-based index, then remaining, retry_after_us (0 = this limit would
-- admit, -1 = never), reset_after_us for each limit; when admitted, then `now` (each limit's
-- charge lies just before now + its reset_after_us, which a refund needs).
local now = clock()
local cost = int_arg(2, 'cost', 1)
local n = #KEYS
if n < 1 or #ARGV ~= 2 + 2 * n then
  fail('invalid argument count')
end

local emission, burst, tolerance, tat = {}, {}, {}, {}
for i = 1, n do
  emission[i] = int_arg(1 + 2 * i, 'emission', 1)
  burst[i] = int_arg(2 + 2 * i, 'burst', 1)
  tolerance[i] = emission[i] * burst[i]
  if tolerance[i] > MAX then
    fail('invalid argument burst')
  end
end
for i = 1, n do
  tat[i] = now
  local raw = redis.call('GET', KEYS[i])
  if raw then
    local t = stored_int(raw, 'TAT')
    if t > now then
      tat[i] = t
    end
  end
end

local retry = {}
local allowed = true
for i = 1, n do
  if cost > burst[i] then
    retry[i] = -1
    allowed = false
  else
    local allow_at = tat[i] + cost * emission[i] - tolerance[i]
    if allow_at > now then
      retry[i] = allow_at - now
      allowed = false
    else
      retry[i] = 0
    end
  end
end

local remaining, reset = {}, {}
for i = 1, n do
  local t = tat[i]
  if allowed then
    t = t + cost * emission[i]
    redis.call('SET', KEYS[i], fmt(t), 'PX', ms_ceil(t - now))
  end
  local left = math.floor((now + tolerance[i] - t) / emission[i])
  if left < 0 then
    left = 0
  end
  remaining[i] = left
  reset[i] = t - now
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
