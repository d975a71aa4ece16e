-- Let a dead letter's message be recorded again when it is dead-lettered
-- again: drop the key naming the record of its delivered message, if that
-- key still names this record.
-- KEYS[1] the dead letter's hash
-- ARGV[1] its id
local delivery = redis.call('HGET', KEYS[1], 'delivery')
if delivery then
  if redis.call('GET', delivery) == ARGV[1] then
    redis.call('DEL', delivery)
  end
  redis.call('HDEL', KEYS[1], 'delivery')
end
return 0
