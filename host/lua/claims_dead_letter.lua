-- Record a dead letter; for a claimed message only if its fence is current,
-- marking the claim dead in the same step.
-- KEYS[1] hash of claim counts by state, KEYS[2] dead-letter id sequence,
-- KEYS[3] list of dead-letter ids, KEYS[4] claim hash, KEYS[5] sorted set of
-- settled claims by time (retention)
-- ARGV[1] fence ('' = not claimed), ARGV[2] plugin, ARGV[3] key, ARGV[4] msg_id,
-- ARGV[5] headers, ARGV[6] payload, ARGV[7] reason, ARGV[8] plugin_version,
-- ARGV[9] now, ARGV[10] key prefix of dead-letter hashes, ARGV[11] for a
-- message not claimed, the key holding the id of the dead letter recorded
-- for that delivered message ('' = none): while that record exists, a
-- redelivery (its answer or ack failed) records none
-- Returns 1 recorded (or recorded before), 0 stale
local now = ARGV[9]
local attempts, first_seen, version = 0, now, ARGV[8]
if ARGV[1] ~= '' then
  local c = redis.call('HMGET', KEYS[4], 'fence', 'state', 'attempts', 'created_at', 'plugin_version')
  if not (c[1] and tonumber(c[1]) == tonumber(ARGV[1]) and c[2] == 'running') then
    return 0
  end
  attempts, first_seen, version = c[3], c[4], c[5] or ARGV[8]
  -- Retired: the fence grows, as on every claim store.
  redis.call('HSET', KEYS[4], 'state', 'dead', 'fence', tonumber(c[1]) + 1, 'owner', '', 'lease_until', 0,
    'last_error', ARGV[7], 'updated_at', now)
  redis.call('HINCRBY', KEYS[1], 'running', -1)
  redis.call('HINCRBY', KEYS[1], 'dead', 1)
  redis.call('ZADD', KEYS[5], now, KEYS[4])
end
local delivery = ARGV[11] ~= '' and ARGV[11] or nil
local id = record_dead_letter(ARGV[10], now, ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], attempts, version,
  first_seen, delivery)
if ARGV[1] ~= '' then
  -- Kept by retention while this record is (see claims_sweep.lua).
  redis.call('HSET', KEYS[4], 'dead_letter', id)
end
return 1
