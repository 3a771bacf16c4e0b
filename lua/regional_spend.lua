-- Several regions: one check in a region's own Redis (after prelude.lua). The region spends
-- units of its pool, which the home region's Redis granted (regional_grant_*.lua) and which
-- regional_fill.lua put here; while the region is cut off from the others, it decides from a
-- GCRA of its own at its share of the limit instead: the home region charges what it admits
-- so to the key's own state at once (KEYS[4]), another region counts it as owed to the home.
-- Never reaches another region.
-- KEYS[1]  the pool hash: `u1`/`e1` the older block's units and expiry, `u2`/`e2` the newer
--          block's, `o` units admitted here that the home has not been charged with yet
--          (borrowed, or admitted while cut off), `s` units asked for since `t`, the time of
--          the last refill asked for, and
--          `a0`..`a31` a ring of what this region admitted, `SLOT:UNITS` per slot of
--          `slot_us`, at `SLOT % 32`, and `n` the time of the last script here (a clock
--          earlier than that has stepped back: how long the blocks have lived is not known, so
--          they are dropped, and no block outlives its lifetime in real time)
-- KEYS[2]  the refill marker (one refill in flight per key and region)
-- KEYS[3]  the TAT of the GCRA at the region's share (used while cut off)
-- KEYS[4]  (in the home region only) the key's state under the global limit: GCRA's TAT or
--          the token bucket's hash
-- ARGV     now|'', cost, cut (0|1), borrow, lead_us, lifetime_us, pool_ttl_ms, marker_ms,
--          emission_us, burst (the global limit), share_emission_us, share_burst,
--          bucket (0: GCRA, 1: token bucket), slot_us, since_us (while cut off: how long ago
--          this instance last reached the regions it must reach; 0 otherwise)
-- While cut off, the share's GCRA counts everything the region admitted since then (from its
-- pool too, before the cut was seen): its TAT is at least `now - since_us` plus those units'
-- emission, so the region admits at most its share of the limit over the whole cut.
-- Reply    {allowed (0|1), remaining, retry_after_us (-1 = never), reset_after_us,
--          refill (0|1: this call took the marker, the caller asks the home), want, owed,
--          first (0|1: no block has landed in this region's pool yet, so a refill asked for
--          now is the key's first here, and a refusal may be only its wait for it; 0 while
--          cut off and for a cost that can never fit), now (this script's time: a refill's
--          grant is put into the pool with it, see regional_fill.lua)}
local now = clock()
local cost = int_arg(2, 'cost', 1)
local cut = int_arg(3, 'cut', 0)
local borrow = int_arg(4, 'borrow', 0)
local lead = int_arg(5, 'lead', 0)
local lifetime = int_arg(6, 'lifetime', 1)
local pool_ttl = int_arg(7, 'pool_ttl', 1)
local marker_ms = int_arg(8, 'marker', 1)
local emission = int_arg(9, 'emission', 1)
local burst = int_arg(10, 'burst', 1)
local s_emission = int_arg(11, 'share_emission', 1)
local s_burst = int_arg(12, 'share_burst', 1)
local bucket = int_arg(13, 'bucket', 0)
local slot = int_arg(14, 'slot', 1)
local since_us = int_arg(15, 'since', 0)
if emission * burst > MAX or s_emission * s_burst > MAX then
  fail('invalid argument burst')
end

local RING = 32
local cur = math.floor(now / slot)
local at = 'a' .. fmt(cur % RING)
local h = redis.call('HMGET', KEYS[1], 'u1', 'e1', 'u2', 'e2', 'o', 's', 't', at, 'n')
local warm = h[1] or h[3] or h[5] or h[6] or h[7]
local function field(i, what)
  if h[i] then
    return stored_int(h[i], what)
  end
  return 0
end
local u1, e1, u2, e2 = field(1, 'pool'), field(2, 'pool'), field(3, 'pool'), field(4, 'pool')
local owed, asked, since = field(5, 'pool'), field(6, 'pool'), field(7, 'pool')
local seen = field(9, 'pool')
if seen > now then
  -- The clock stepped back: how long the blocks have lived is not known, so they go.
  u1, u2 = 0, 0
end
if e1 <= now then u1 = 0 end
if e2 <= now then u2 = 0 end


-- The ring's slot `at` with `units` more admitted in the current slot.
local function ring_add(units)
  local slot_of, n = string.match(h[8] or '', '^(%d+):(%d+)$')
  if slot_of and tonumber(slot_of) == cur then
    return fmt(cur) .. ':' .. fmt(tonumber(n) + units)
  end
  return fmt(cur) .. ':' .. fmt(units)
end

-- What the ring holds from slot `from` on.
local function ring_since(from)
  local names = {}
  for i = 0, RING - 1 do
    names[#names + 1] = 'a' .. fmt(i)
  end
  local sum = 0
  for _, v in ipairs(redis.call('HMGET', KEYS[1], unpack(names))) do
    local slot_of, n = string.match(v or '', '^(%d+):(%d+)$')
    if slot_of and tonumber(slot_of) >= from then
      sum = sum + tonumber(n)
    end
  end
  return sum
end

-- The home region, cut off: `cost` admitted on its share charged to the key's global state at
-- once, down to a drained key (as regional_grant_*.lua charge what a region owes).
local function charge_home(cost)
  if bucket == 0 then
    local tat = redis.call('GET', KEYS[4])
    if tat then
      tat = stored_int(tat, 'TAT')
      if tat < now then tat = now end
    else
      tat = now
    end
    tat = math.max(tat, math.min(tat + cost * emission, now + emission * burst))
    if tat > now then
      redis.call('SET', KEYS[4], fmt(tat), 'PX', ms_ceil(tat - now))
    end
  else
    local tokens, ts = burst, now
    local st = redis.call('HMGET', KEYS[4], 'n', 't')
    if st[1] or st[2] then
      tokens = stored_int(st[1], 'token count')
      ts = stored_int(st[2], 'timestamp')
    end
    local t_eff
    tokens, ts, t_eff = credit(tokens, ts, now, emission, burst)
    tokens = math.max(tokens - cost, 0)
    if tokens < burst then
      redis.call('HSET', KEYS[4], 'n', fmt(tokens), 't', fmt(ts))
      redis.call('PEXPIRE', KEYS[4], ms_ceil(bucket_wait(tokens, ts, t_eff, now, emission, burst)))
    end
  end
end

if cut == 1 then
  -- GCRA at the region's share, on the region's own key.
  local tolerance = s_emission * s_burst
  local tat = redis.call('GET', KEYS[3])
  if tat then
    tat = stored_int(tat, 'TAT')
    if tat < now then tat = now end
  else
    tat = now
  end
  -- Everything admitted since the region last reached the others counts against the share.
  if since_us > 0 then
    local from = math.max(now - since_us, 0)
    local spent = ring_since(math.floor(from / slot))
    local floor = from + math.min(spent * s_emission, MAX)
    if floor > tat then tat = math.min(floor, now + MAX) end
  end
  local available = math.floor((now + tolerance - tat) / s_emission)
  if available < 0 then available = 0 end
  if cost > s_burst then
    return { 0, available, -1, tat - now, 0, 0, owed, 0, now }
  elseif cost > available then
    return { 0, available, tat + cost * s_emission - tolerance - now, tat - now, 0, 0, owed, 0,
      now }
  end
  tat = tat + cost * s_emission
  redis.call('SET', KEYS[3], fmt(tat), 'PX', ms_ceil(tat - now))
  if KEYS[4] then
    charge_home(cost)
  else
    owed = owed + cost
  end
  redis.call('HSET', KEYS[1], 'o', fmt(owed), at, ring_add(cost), 'e1', fmt(e1), 'e2', fmt(e2),
    'n', fmt(now))
  redis.call('PEXPIRE', KEYS[1], pool_ttl)
  return { 1, available - cost, 0, tat - now, 0, 0, owed, 0, now }
end

local allowed = 0
if cost > burst then
  allowed = -1
elseif u1 + u2 >= cost then
  local from1 = math.min(u1, cost)
  u1 = u1 - from1
  u2 = u2 - (cost - from1)
  allowed = 1
elseif not warm and cost <= borrow then
  -- A cold key: admitted on credit, charged at the home with the next grant.
  owed = owed + cost
  allowed = 1
end
asked = asked + cost
local left = u1 + u2

-- Demand: the units asked for since the last refill, over the time since; the low-water mark
-- is that demand over `lead`, the block it asks for that demand over half a lifetime.
local refill, want = 0, 0
local span = now - since
if since == 0 or span < 1000 then span = 1000 end
local low = math.ceil(asked * lead / span)
if left <= low or owed > 0 then
  if redis.call('SET', KEYS[2], '1', 'NX', 'PX', marker_ms) then
    refill = 1
    if since == 0 then
      -- A key's first block here: what its rate makes in a lead time (its demand is not
      -- known yet).
      want = math.ceil(lead / emission)
    else
      want = math.ceil(asked * (lead + lifetime / 2) / span)
    end
    if want < cost then want = cost end
    if want > burst then want = burst end
    asked, since = 0, now
  end
end
redis.call('HSET', KEYS[1], 'u1', fmt(u1), 'e1', fmt(e1), 'u2', fmt(u2), 'e2', fmt(e2),
  'o', fmt(owed), 's', fmt(asked), 't', fmt(since), 'n', fmt(now))
if allowed == 1 then
  redis.call('HSET', KEYS[1], at, ring_add(cost))
end
redis.call('PEXPIRE', KEYS[1], pool_ttl)
-- No block ever landed here: a grant sets e2.
local first = 0
if e1 == 0 and e2 == 0 then
  first = 1
end
if allowed == 1 then
  return { 1, left, 0, emission * math.max(burst - left, 0), refill, want, owed, first, now }
elseif allowed == -1 then
  return { 0, left, -1, emission * burst, refill, want, owed, 0, now }
end
return { 0, left, emission * (cost - left), emission * burst, refill, want, owed, first, now }
