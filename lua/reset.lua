-- Reset of a key's state under a built-in algorithm (after prelude.lua and gcra_state.lua):
-- the key's next check finds it rested, and a refund of a check admitted before the reset
-- gives nothing back (the reset gave back all it held), so that it cannot hand out the units
-- of checks admitted after.
--
-- GCRA, the token bucket, several GCRA limits: each limit's state goes (GCRA's copy of a ban
-- stays) and its refund ledger (see refund_ledger.lua) becomes 'until floor': a floor just
-- after now (charges admitted at or before now give nothing back), kept for the limit's lead
-- (a charge admitted before now ends by now + lead, so none can claim anything after).
-- The sliding window: the log goes, its totals say nothing is in use, and its hash keeps the
-- newest time and the last sequence number (and its expiry), so that no member written after
-- the reset bears the name (time, sequence number) of one written before.
-- A fixed window: its count goes to zero under a new id, just after now and after the old one
-- (see fixed_window_core.lua), keeping its expiry: a refund of a check admitted before
-- reported the old id, and gives nothing back.
-- KEYS     times: each limit's state, then each limit's ledger; a log: its hash, the log; a
--          fixed window: its state
-- ARGV     now|'', kind (0: times; 1: GCRA's time, which may hold a ban's copy; 2: a log; 3: a
--          fixed window), then for times each limit's lead in microseconds (emission interval
--          times burst)
-- Reply    how many of the states existed
local now = clock()
local kind = int_arg(2, 'kind', 0)
if kind == 3 then
  local raw = redis.call('GET', KEYS[1])
  local ttl = redis.call('PTTL', KEYS[1])
  if not raw or ttl < 1 then
    return 0
  end
  local id = stored_int(string.match(raw, '^(%d+) ') or '', 'window')
  if id < now then
    id = now
  end
  redis.call('SET', KEYS[1], fmt(id + 1) .. ' 0', 'PX', ttl)
  return 1
end
if kind == 2 then
  local existed = redis.call('DEL', KEYS[2])
  local added = redis.call('HGET', KEYS[1], 'a')
  if added then
    redis.call('HSET', KEYS[1], 'r', added) -- keeps the hash's expiry
    existed = 1
  end
  return existed
end
local n = #KEYS / 2
if n < 1 or n % 1 ~= 0 or #ARGV ~= 2 + n or (kind == 1 and n ~= 1) then
  fail('invalid argument count')
end
local existed = 0
for i = 1, n do
  local lead = int_arg(2 + i, 'lead', 1)
  if kind == 1 then
    local raw = redis.call('GET', KEYS[i])
    if raw then
      existed = existed + 1
      local _, ban = gcra_state(raw, KEYS[i])
      gcra_write(KEYS[i], nil, ban, now)
    end
  else
    existed = existed + redis.call('DEL', KEYS[i])
  end
  redis.call('SET', KEYS[n + i], fmt(now + lead) .. ' ' .. fmt(now + 1), 'PX', ms_ceil(lead))
end
return existed
