-- Before an outbound call: may it go, by what the upstream said (see upstream_learn.lua)?
-- KEYS[1]  the learned hash
-- ARGV     now|'', cost
-- Reply    {go (0|1), wait_us}: when paused, or when the upstream's window has fewer units
--          left than the cost, 0 and the time until the pause or the window ends; when a
--          window ended and another call is learning the next, 0 and a short wait; otherwise
--          1 (the cost is taken from the units left, when they are known).
local PROBE_US = 1000000
local POLL_US = 20000
local KEEP_MS = 60000
local now = clock()
local cost = int_arg(2, 'cost', 1)
local st = redis.call('HMGET', KEYS[1], 'p', 'r', 'e', 'q')
if st[1] then
  local paused = stored_int(st[1], 'pause')
  if paused > now then
    return { 0, paused - now }
  end
end
if st[2] and st[3] then
  local left = stored_int(st[2], 'remaining')
  local ends = stored_int(st[3], 'window end')
  if ends > now then
    if left < cost then
      return { 0, ends - now }
    end
    redis.call('HSET', KEYS[1], 'r', fmt(left - cost))
    return { 1, 0 }
  end
  -- The learned window is over and the next one is not known yet: one call goes first and
  -- learns it; the others wait for its answer (for at most PROBE_US, should it never come),
  -- so that calls sent blind cannot overrun the new window.
  if st[4] then
    local probe = stored_int(st[4], 'probe')
    if probe > now then
      return { 0, math.min(probe - now, POLL_US) }
    end
  end
  redis.call('HSET', KEYS[1], 'q', fmt(now + PROBE_US))
end
-- A call sent blind (no window known): counted, so that the answer teaching the window can
-- take off the others still on their way (see upstream_learn.lua).
redis.call('HINCRBY', KEYS[1], 'b', 1)
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], KEEP_MS)
end
return { 1, 0 }
