-- A dead claim's fresh start for a dead-letter replay: no attempts or traps
-- counted, due now; only the claim taken for this payload. The payload hash
-- stays.
-- KEYS[1] hash of claim counts by state, KEYS[2] claim hash, KEYS[3] sorted
-- set of settled claims (retention)
-- ARGV[1] now, ARGV[2] payload hash of the dead letter
-- Returns 1 revived, 0 not dead (or dead for another payload)
local c = redis.call('HMGET', KEYS[2], 'state', 'payload_hash')
if c[1] ~= 'dead' or c[2] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'retry', 'owner', '', 'lease_until', 0, 'not_before', 0,
  'attempts', 0, 'traps', 0, 'last_error', '', 'updated_at', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'dead', -1)
redis.call('HINCRBY', KEYS[1], 'retry', 1)
redis.call('ZREM', KEYS[3], KEYS[2])
return 1
