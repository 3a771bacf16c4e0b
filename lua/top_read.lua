-- The fleet's top keys (`RateLimiter::fleet_top_keys`): every snapshot published within its
-- time, as a flat list instance, snapshot, instance, snapshot...
-- KEYS[1], KEYS[2], ARGV[1]: as in top_publish.lua (ARGV[1]: how long a snapshot counts, ms)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. (now - tonumber(ARGV[1])), '+inf')
local out = {}
-- HMGET by chunks: unpack's arguments are bounded by Lua's stack.
local CHUNK = 500
for first = 1, #live, CHUNK do
  local last = math.min(first + CHUNK - 1, #live)
  local snapshots = redis.call('HMGET', KEYS[1], unpack(live, first, last))
  for i = first, last do
    local snapshot = snapshots[i - first + 1]
    if snapshot then
      out[#out + 1] = live[i]
      out[#out + 1] = snapshot
    end
  end
end
return out
