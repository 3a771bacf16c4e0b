-- Fixed window, read without a check (after prelude.lua and fixed_window_core.lua): what a
-- check would see, writing nothing.
-- KEYS[1]  the key's window, KEYS[2] the key's ban
-- ARGV     as fixed_window.lua (the cost is not read)
-- Reply    {ban_left_us (0 = none), remaining, reset_after_us (until the window ends)}
local now, _, limit, period, calendar = window_args()
local banned = ban_left(KEYS[2], now)
local _, finish, _, count = window_state(KEYS[1], now, period, calendar)
local remaining = limit - count
if remaining < 0 then
  remaining = 0
end
return { banned, remaining, finish - now }
