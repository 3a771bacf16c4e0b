-- tower-redis-ratelimit: GCRA, batch form (what exact batching sends for GCRA checks instead of
-- batch.lua around a script). Decides several checks in one atomic call, in the order given,
-- each exactly as its own call of gcra.lua would at the same instant: the same decisions, the
-- same errors and the same state left behind. What it saves per check: one MGET reads every key
-- up front, a check is a few operations on locals (the checks of one key come one after the
-- other, so no table is kept per key), one write per key written, a check's arguments come once
-- per run of checks that share them, and MGET's reply is reused as the reply.
--
-- KEYS     one per check: its TAT, as gcra.lua's KEYS[1]. The checks of one key come one after
--          the other, in the order they are decided (the crate orders them so: checks of
--          different keys do not depend on each other's order)
-- ARGV[1]  now|'' (one time for every check; '' for the server's TIME)
-- then, per run of consecutive checks with the same arguments: how many, then gcra.lua's
--          ARGV[1..3] (step, tolerance, a rested key's lifetime in ms)
-- Reply    one entry per check, then now: the integer TAT - now when admitted (positive; the
--          key's TAT is now + that), now - TAT when denied (0 or less), {2, 0, left_us, left_us}
--          when banned, or the message of the error its own call would have got, as a string.
--
-- As in gcra.lua, the arguments are not validated (only RedisStore's batching task calls this
-- script, with arguments built from validated types); the stored values are.
-- Globals read once: every check reads KEYS, and every key written formats its TAT.
local KEYS, ARGV, call, format, ceil = KEYS, ARGV, redis.call, string.format, math.ceil
local WRONGTYPE = 'WRONGTYPE Operation against a key holding the wrong kind of value'

local n = #KEYS
local now = ARGV[1]
if now == '' then
  local t = call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = now + 0
end

-- Each key's stored value, overwritten with each check's reply as the checks are decided.
local out = call('MGET', unpack(KEYS))

-- The key being decided: its first check, its TAT (false: corrupted), its ban's end, whether
-- MGET found nothing under it, whether a check charged it, and its lifetime in ms when known
-- without formatting (charged once, from rest).
local key, first, tat, ban, fresh, charged, life

-- Writes what the checks of `key` (from `first` to `last`) left. A key MGET found nothing under
-- but that exists holds another type: each of its checks fails as its own call would have at
-- its GET, and nothing is written.
local function finish(last)
  local wrong = false
  if charged then
    local px = life or format('%d', ceil((tat - now) / 1000))
    if fresh then
      wrong = not call('SET', key, format('%d', tat), 'PX', px, 'NX')
    else
      call('PSETEX', key, px, format('%d', tat))
    end
  elseif fresh then
    wrong = call('EXISTS', key) == 1
  end
  if wrong then
    for j = first, last do
      out[j] = WRONGTYPE
    end
  end
end

local i = 0
for a = 2, #ARGV, 4 do
  local step, tolerance, rested = ARGV[a + 1] + 0, ARGV[a + 2] + 0, ARGV[a + 3]
  for _ = 1, ARGV[a] do
    i = i + 1
    if KEYS[i] ~= key then
      if key then
        finish(i - 1)
      end
      key, first, charged, life, ban = KEYS[i], i, false, nil, 0
      local raw = out[i]
      fresh = not raw
      if fresh then
        tat = 0
      else
        tat = tonumber(raw)
        if tat == nil then
          local at, ends = string.match(raw, '^(%d+):(%d+)$')
          tat, ban = tonumber(at), tonumber(ends)
        end
        if tat == nil or tat % 1 ~= 0 or tat < 0 or tat > 4503599627370496 or ban == nil
            or ban > 4503599627370496 then
          tat, ban = false, 0
        end
      end
    end
    if not tat then
      out[i] = 'ERR tower-redis-ratelimit: corrupted TAT under ' .. key
    elseif ban > now then
      out[i] = { 2, 0, ban - now, ban - now }
    else
      local from = tat
      if from < now then
        from = now
      end
      local new = from + step
      if new - tolerance > now then
        out[i] = now - from
      else
        if charged then
          life = nil
        else
          charged, life = true, rested
          if from > now then
            life = nil
          end
        end
        tat = new
        out[i] = new - now
      end
    end
  end
end
if i ~= n then
  return redis.error_reply('ERR tower-redis-ratelimit: batch arguments out of range')
end
if key then
  finish(n)
end
out[n + 1] = now
return out
