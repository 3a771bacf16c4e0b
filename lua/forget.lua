-- Deletes the keys given (a key's state on a reset, its ban on an unban, its concurrency
-- holders): one script call, so that it goes where the keys' hash slot is, like a check.
-- KEYS     the keys to delete, all of one base key
-- Reply    how many existed
if #KEYS == 0 then
  return 0
end
return redis.call('DEL', unpack(KEYS))
