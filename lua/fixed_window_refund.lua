-- Fixed window, refund (after prelude.lua and fixed_window_core.lua): gives an admitted
-- check's units back to its window, while that window lasts and was not reset since (the
-- state's id is the one the check reported), never below zero. A resent refund would give
-- twice: the caller adds a marker key when its connection may resend (see first_run).
-- KEYS[1]  the key's window; then a refund marker, when given
-- ARGV     now|'', cost, limit, period_us, calendar (as fixed_window.lua), the window's id
-- Reply    1 when the units were given back, 0 otherwise
local now, cost, _, period, calendar = window_args()
local charged = int_arg(6, 'window', 0)
local _, finish, id, count = window_state(KEYS[1], now, period, calendar)
if id ~= charged or count == 0 or not first_run(1) then
  return 0
end
if cost > count then
  cost = count
end
redis.call('SET', KEYS[1], fmt(id) .. ' ' .. fmt(count - cost), 'PX', ms_ceil(finish - now))
return 1
