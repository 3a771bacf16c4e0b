-- Concurrency slots, release: gives a holder's slot back (nothing when it holds none).
-- KEYS[1]  the holders ZSET
-- ARGV     now|'' (unused), holder
-- Reply    1 when a slot was given back, 0 otherwise
--
-- Removing the last holder removes the key.
return redis.call('ZREM', KEYS[1], ARGV[2])
