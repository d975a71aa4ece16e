-- Shared by the claim and dead-letter scripts, which begin with it: record
-- a dead letter under `prefix` .. id, its id taken from KEYS[2] and listed
-- (newest first) in KEYS[3]. `delivery`, for a dead letter no claim retires
-- (bad input, a conflict), names the key that holds the id of the one
-- recorded for that delivered message: while that record exists, a
-- redelivery (its answer or ack failed) records none. Returns the id
-- recorded (nil when none was).
local function record_dead_letter(prefix, now, plugin, key, msg_id, headers, payload, reason, attempts, version,
                                  first_seen, delivery)
  if delivery then
    local prior = redis.call('GET', delivery)
    if prior and redis.call('EXISTS', prefix .. prior) == 1 then
      return
    end
  end
  local id = redis.call('INCR', KEYS[2])
  redis.call('HSET', prefix .. id, 'id', id, 'plugin', plugin, 'key', key, 'msg_id', msg_id,
    'headers', headers, 'payload', payload, 'reason', reason, 'attempts', attempts,
    'plugin_version', version, 'first_seen_at', first_seen, 'dead_at', now)
  if delivery then
    redis.call('HSET', prefix .. id, 'delivery', delivery)
    redis.call('SET', delivery, id)
  end
  redis.call('LPUSH', KEYS[3], id)
  return id
end

