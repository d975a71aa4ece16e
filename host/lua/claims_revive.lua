-- A dead claim's fresh start for a dead-letter replay: no attempts or traps
-- counted, due now. The payload hash stays.
-- KEYS[1] hash of claim counts by state, KEYS[2] claim hash
-- ARGV[1] now
-- Returns 1 revived, 0 not dead
if redis.call('HGET', KEYS[2], 'state') ~= 'dead' then
  return 0
end
redis.call('HSET', KEYS[2], 'state', 'retry', 'owner', '', 'lease_until', 0, 'not_before', 0,
  'attempts', 0, 'traps', 0, 'last_error', '', 'updated_at', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'dead', -1)
redis.call('HINCRBY', KEYS[1], 'retry', 1)
return 1
