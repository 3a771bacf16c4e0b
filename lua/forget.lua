-- Deletes the keys given (a key's ban on an unban, its concurrency holders, a custom
-- algorithm's state on a reset): one script call, so that it goes where the keys' hash slot
-- is, like a check.
-- KEYS     the keys to delete, all of one base key
-- ARGV[1]  (optional) 'keep-tat': KEYS[1] is a GCRA state (`TAT` or `TAT:BAN`, see keys.rs)
--          whose TAT stays and whose ban's copy goes (an unban); it keeps its expiry
-- Reply    how many existed
local first, existed = 1, 0
if ARGV[1] == 'keep-tat' then
  first = 2
  local raw = redis.call('GET', KEYS[1])
  if raw then
    existed = 1
    local tat = string.match(raw, '^(%d+):%d+$')
    if tat then
      local ttl = tat ~= '0' and redis.call('PTTL', KEYS[1]) or 0
      if ttl > 0 then
        redis.call('SET', KEYS[1], tat, 'PX', ttl)
      else
        redis.call('DEL', KEYS[1])
      end
    end
  end
end
if #KEYS < first then
  return existed
end
return existed + redis.call('DEL', unpack(KEYS, first))
