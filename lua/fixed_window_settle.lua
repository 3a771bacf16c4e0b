-- Fixed window, a settlement (after prelude.lua and fixed_window_core.lua): an admitted
-- check's charge of `cost` settled to `actual` units. Below the charge, `cost - actual` units
-- go back to the check's window as fixed_window_refund.lua gives (while that window lasts
-- and was not reset since, never below zero); above it, `actual - cost` more units are
-- counted in the current window whatever the limit (the debt ends with the window; the count
-- never passes 2^52).
-- KEYS[1]  the key's window; then a marker, when given (see `first_run` in prelude.lua)
-- ARGV     now|'', cost, limit, period_us, calendar (as fixed_window.lua), actual, the check's
--          window's id (0 when settling up: unread)
-- Reply    1 when the state changed, 0 otherwise
local now, cost, _, period, calendar = window_args()
local actual = int_arg(6, 'actual', 0)
local charged = int_arg(7, 'window', 0)
if actual == cost then
  return 0
end
local _, finish, id, count = window_state(KEYS[1], now, period, calendar)
if actual > cost then
  if not first_run(1) then
    return 0
  end
  count = count + (actual - cost)
  if count > MAX then
    count = MAX
  end
elseif id ~= charged or count == 0 or not first_run(1) then
  return 0
else
  local back = cost - actual
  if back > count then
    back = count
  end
  count = count - back
end
redis.call('SET', KEYS[1], fmt(id) .. ' ' .. fmt(count), 'PX', ms_ceil(finish - now))
return 1
