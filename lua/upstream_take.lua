-- Before an outbound call: may it go, by what the upstream said (see upstream_learn.lua)?
-- KEYS[1]  the learned hash: p = paused until, r = units left in the upstream's window, e =
--          its end, q = a call is learning the next window until then, b = calls sent blind
--          (no window known) since s
-- ARGV     now|'', cost
-- Reply    {go (0|1), wait_us, blind (0|1|2)}:
--          * paused, or the window has fewer units left than the cost: 0 and the time until
--            the pause or the window ends;
--          * the window ended and another call is learning the next: 0 and a short wait;
--          * otherwise 1, with the cost taken from the units left when they are known
--            (blind 0); else the call goes blind (1), or goes first to learn the next window
--            (2). The answer to a blind call is recorded even when it says nothing (see
--            upstream_learn.lua).
local PROBE_US = 1000000 -- how long a call learning the next window holds the others back
local POLL_US = 20000 -- the longest the others wait before asking again
local BLIND_US = 10000000 -- blind calls older than this are taken as answered (lost answers)
local KEEP_MS = 60000
local now = clock()
local cost = int_arg(2, 'cost', 1)
local st = redis.call('HMGET', KEYS[1], 'p', 'r', 'e', 'q', 'b', 's')
if st[1] then
  local paused = stored_int(st[1], 'pause')
  if paused > now then
    return { 0, paused - now, 0 }
  end
end
local blind = 1
if st[2] and st[3] then
  local left = stored_int(st[2], 'remaining')
  local ends = stored_int(st[3], 'window end')
  if ends > now then
    if left < cost then
      return { 0, ends - now, 0 }
    end
    redis.call('HSET', KEYS[1], 'r', fmt(left - cost))
    return { 1, 0, 0 }
  end
  -- The window is over and the next one is not known yet: one call goes first and learns
  -- it; the others wait for its answer (for at most PROBE_US, should it never come), so that
  -- calls sent blind cannot overrun the new window.
  if st[4] then
    local q = stored_int(st[4], 'probe')
    if q > now then
      return { 0, math.min(q - now, POLL_US), 0 }
    end
  end
  redis.call('HSET', KEYS[1], 'q', fmt(now + PROBE_US))
  blind = 2
end
-- A call sent blind: counted until its answer comes back (or for BLIND_US), so that the
-- answer teaching the window can take off the others still on their way.
local since = nil
if st[6] then
  since = stored_int(st[6], 'blind since')
end
if st[5] and since and since >= now - BLIND_US then
  redis.call('HINCRBY', KEYS[1], 'b', 1)
else
  redis.call('HSET', KEYS[1], 'b', 1, 's', fmt(now))
end
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], KEEP_MS)
end
return { 1, 0, blind }
