-- Before an outbound call: may it go, by what the upstream said (see upstream_learn.lua)?
-- KEYS[1]  the learned hash: p = paused until, r = units left in the upstream's window, e =
--          its end, q = a call is learning the next window until then, b = calls sent blind
--          (no window known) since s; n and w = the upstream's rate (units per window, µs),
--          t = the next free place in its pace; x = the rate was estimated from a 429; a and
--          c = calls answered without a word since c (while nothing is known); b counts
--          units (each blind call its cost), so that a token budget's blind calls count
--          their estimates
-- ARGV     now|'', cost, budget_us (the longest the caller may wait for its place)
-- Reply    {go (0|1), wait_us, blind (0|1|2)}:
--          * paused: 0 and the time until the pause ends;
--          * the rate is known: the call's place in the pace, one unit every w / n / 0.97 µs
--            (a little below the upstream's rate, so that the jitter of the calls' way there
--            never lets a window see more than its quota): 1 and the wait until its place, which
--            is kept for it (the pace moves on by its cost); when the wait is beyond the budget,
--            0 and that wait, and nothing is kept. The known window's count is not consulted:
--            resets are whole seconds, an upper bound (upstream_learn.lua slows the pace when an
--            answer says none is left);
--          * the window has fewer units left than the cost: 0 and the time until it ends;
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
local budget = int_arg(3, 'budget', 0)
local st = redis.call('HMGET', KEYS[1], 'p', 'r', 'e', 'q', 'b', 's', 'n', 'w', 't')
if st[1] then
  local paused = stored_int(st[1], 'pause')
  if paused > now then
    return { 0, paused - now, 0 }
  end
end
if st[7] and st[8] then
  local n = stored_int(st[7], 'rate quota')
  local w = stored_int(st[8], 'rate window')
  if n > 0 and w > 0 then
    local slot = now
    if st[9] then
      slot = math.max(now, stored_int(st[9], 'pace'))
    end
    local wait = slot - now
    if wait > budget then
      return { 0, wait, 0 }
    end
    local next_ = math.min(slot + math.ceil(w * 100 / (n * 97)) * cost, MAX)
    redis.call('HSET', KEYS[1], 't', fmt(next_))
    redis.call('PEXPIRE', KEYS[1], ms_ceil(next_ - now + KEEP_MS * 1000))
    return { 1, wait, 0 }
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
  redis.call('HINCRBY', KEYS[1], 'b', cost)
else
  redis.call('HSET', KEYS[1], 'b', cost, 's', fmt(now))
end
-- With nothing known of the upstream, its calls are counted from the first (see the rate
-- estimated from a 429 in upstream_learn.lua).
if blind == 1 then
  redis.call('HSETNX', KEYS[1], 'c', fmt(now))
end
if redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], KEEP_MS)
end
return { 1, 0, blind }
