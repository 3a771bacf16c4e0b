-- A limit's marker: whether the store still holds what it held.
-- KEYS[1]  the marker: a token, set by the first instance that finds none
-- ARGV[1]  the token to set when there is none
--
-- Answers the token the marker holds after the call. A store that restarted without
-- persistence, or was flushed, lost the marker with the rest of the limit's state (its bans
-- too): the first instance to look sets a new token, and every instance that had seen the old
-- one finds another and knows the state was lost. The marker lives a day after the last look.
local MARKER_TTL_MS = 86400000
local token = redis.call('GET', KEYS[1])
if not token then
  token = ARGV[1]
  redis.call('SET', KEYS[1], token)
end
redis.call('PEXPIRE', KEYS[1], MARKER_TTL_MS)
return token
