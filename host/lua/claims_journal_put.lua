-- Journal a step's response if the claim's fence is current; the first
-- response journaled for a step is kept.
-- KEYS[1] claim hash, KEYS[2] journal hash of the message, KEYS[3] hash of
-- counts (its `journal` field counts journaled steps)
-- ARGV[1] fence, ARGV[2] step, ARGV[3] request hash, ARGV[4] response
-- Returns 1 journaled (or already there), 0 stale
local c = redis.call('HMGET', KEYS[1], 'fence', 'state')
if not (c[1] and tonumber(c[1]) == tonumber(ARGV[1]) and c[2] == 'running') then
  return 0
end
if redis.call('HSETNX', KEYS[2], ARGV[2] .. '\0r', ARGV[4]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[2] .. '\0h', ARGV[3])
  redis.call('HINCRBY', KEYS[3], 'journal', 1)
end
return 1
