-- Give a running claim back for a retry, if its fence is current.
-- KEYS[1] hash of claim counts by state, KEYS[2] claim hash
-- ARGV[1] fence, ARGV[2] not_before, ARGV[3] error, ARGV[4] trapped (0/1), ARGV[5] now
-- Returns 1 released, 0 stale
local c = redis.call('HMGET', KEYS[2], 'fence', 'state')
if not (c[1] and tonumber(c[1]) == tonumber(ARGV[1]) and c[2] == 'running') then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'retry', 'owner', '', 'lease_until', 0, 'not_before', ARGV[2],
  'last_error', ARGV[3], 'updated_at', ARGV[5])
redis.call('HINCRBY', KEYS[2], 'traps', tonumber(ARGV[4]))
redis.call('HINCRBY', KEYS[1], 'running', -1)
redis.call('HINCRBY', KEYS[1], 'retry', 1)
return 1
