-- The fleet's top keys (`RateLimiter::fleet_top_keys`): every snapshot published within its
-- time, as a flat list instance, snapshot, instance, snapshot...
-- KEYS[1], KEYS[2], ARGV[1]: as in top_publish.lua (ARGV[1]: how long a snapshot counts, ms)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. (now - tonumber(ARGV[1])), '+inf')
if #live == 0 then
  return {}
end
local snapshots = redis.call('HMGET', KEYS[1], unpack(live))
local out = {}
for i, instance in ipairs(live) do
  if snapshots[i] then
    out[#out + 1] = instance
    out[#out + 1] = snapshots[i]
  end
end
return out
