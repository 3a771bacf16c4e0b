-- Deletes the keys given (a key's state on a reset, its ban on an unban, its concurrency
-- holders): one script call, so that it goes where the keys' hash slot is, like a check.
-- KEYS     the keys to delete, all of one base key
-- ARGV[1]  (optional) KEYS[1] is a GCRA state (`TAT` or `TAT:BAN`, see keys.rs) of which
--          something stays: 'keep-ban' its ban's copy (a reset: the TAT goes, a ban stays),
--          'keep-tat' its TAT (an unban: the ban's copy goes); it keeps its expiry
-- Reply    how many existed
local first, existed = 1, 0
if ARGV[1] then
  first = 2
  local raw = redis.call('GET', KEYS[1])
  if raw then
    existed = 1
    local tat, ban = string.match(raw, '^(%d+):(%d+)$')
    local keep -- what stays of it (nil or false: nothing)
    if ARGV[1] == 'keep-ban' then
      keep = ban and '0:' .. ban
    else
      keep = tat ~= '0' and (tat or raw) -- a state without a ban's copy stays as it is
    end
    if keep ~= raw then
      local ttl = keep and redis.call('PTTL', KEYS[1]) or 0
      if ttl > 0 then
        redis.call('SET', KEYS[1], keep, 'PX', ttl)
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
