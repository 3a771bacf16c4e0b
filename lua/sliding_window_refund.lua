-- Refund for the sliding-window log (after prelude.lua and sliding_window_take.lua): removes
-- the member an admitted check wrote and gives its units back, with work bounded whatever the
-- log's size (see sliding_window_take.lua): as if the request had never happened, or, for a
-- member parked deep inside a long log, its units moved onto the member 64 places older.
-- KEYS[1]  the log (see sliding_window.lua)
-- KEYS[2]  its hash
-- ARGV     now|'', cost, window_us, limit, the member's time, the member's sequence number
-- Reply    1 when the units were given back, 0 otherwise (nothing to give, or moved)
local now = clock()
local window = int_arg(3, 'window', 1000)
int_arg(4, 'limit', 1)
local cost = int_arg(2, 'cost', 1)
local at = int_arg(5, 'time', 0)
local seq = int_arg(6, 'sequence number', 1)
return log_take_off(now, window, cost, at, seq, false)
