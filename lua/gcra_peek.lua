-- GCRA and the multi-limit, read without a check (after prelude.lua and gcra_state.lua): what a check would see,
-- spending nothing and writing nothing. The same arithmetic as gcra_core.lua; the in-memory
-- twin is src/algorithm/peek.rs.
-- KEYS[i]  TAT of limit i; the last key: the key's ban
-- ARGV     now|'', then emission_us, burst for each limit
-- Reply    {ban_left_us (0 = none), then remaining, reset_after_us for each limit}
local n = #KEYS - 1
if n < 1 or #ARGV ~= 1 + 2 * n then
  fail('invalid argument count')
end
local now = clock()
local emission, burst = {}, {}
for i = 1, n do
  emission[i] = int_arg(2 * i, 'emission', 1)
  burst[i] = int_arg(2 * i + 1, 'burst', 1)
  if emission[i] * burst[i] > MAX then
    fail('invalid argument burst')
  end
end
local reply = { ban_left(KEYS[n + 1], now) }
for i = 1, n do
  local tat = now
  local raw = redis.call('GET', KEYS[i])
  if raw then
    tat = gcra_state(raw, KEYS[i]) -- its ban's copy is the ban read above
    if tat < now then
      tat = now
    end
  end
  local available = math.floor((now + emission[i] * burst[i] - tat) / emission[i])
  if available < 0 then
    available = 0
  end
  reply[#reply + 1] = available
  reply[#reply + 1] = tat - now
end
return reply
