-- Take Celery tasks off their lists, atomically into Idem's unacked hash,
-- so a worker killed at any point loses nothing: a task is always in a
-- list, in the unacked hash, or in the delayed set, never in between.
--
-- First give back what is due: deliveries whose visibility ended (their
-- worker died or stalled) go back to the head of their list, as kombu's
-- own restore does; deferred tasks (retries, tasks with an ETA) that are
-- due go to the tail. Then pop up to ARGV[4] tasks, the lists read in the
-- order given (a queue, then its kombu priority lists).
--
-- KEYS[1]  unacked hash: tag -> "<len>:<list><envelope>"
-- KEYS[2]  unacked index (ZSET tag -> visibility deadline, ms)
-- KEYS[3]  delayed set (ZSET "<len>:<list><envelope>" -> due time, ms)
-- KEYS[4]  delivery counts (HASH sha1(envelope) -> times delivered)
-- KEYS[5…] the lists, in the order they are read
-- ARGV[1]  now (ms)
-- ARGV[2]  visibility (ms)
-- ARGV[3]  most entries restored or promoted per call
-- ARGV[4]  most tasks taken
-- ARGV[5]  a fresh prefix: the delivery tags are <prefix>.1, <prefix>.2, …
-- Returns {how many deliveries were restored, {tag, times delivered,
-- envelope} per task taken}.
local unacked, index, delayed, counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, visibility, limit, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local function split(item)
  local colon = string.find(item, ':', 1, true)
  local len = tonumber(string.sub(item, 1, colon - 1))
  return string.sub(item, colon + 1, colon + len), string.sub(item, colon + len + 1)
end

local restored = 0
for _, tag in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, limit)) do
  local item = redis.call('HGET', unacked, tag)
  if item then
    local list, envelope = split(item)
    redis.call('RPUSH', list, envelope)
    redis.call('HDEL', unacked, tag)
    restored = restored + 1
  end
  redis.call('ZREM', index, tag)
end

for _, item in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', now, 'LIMIT', 0, limit)) do
  local list, envelope = split(item)
  redis.call('LPUSH', list, envelope)
  redis.call('ZREM', delayed, item)
end

local out = {}
for i = 5, #KEYS do
  while #out < max do
    local envelope = redis.call('RPOP', KEYS[i])
    if not envelope then break end
    local tag = ARGV[5] .. '.' .. (#out + 1)
    redis.call('HSET', unacked, tag, #KEYS[i] .. ':' .. KEYS[i] .. envelope)
    redis.call('ZADD', index, now + visibility, tag)
    local n = redis.call('HINCRBY', counts, redis.sha1hex(envelope), 1)
    out[#out + 1] = {tag, n, envelope}
  end
end
return {restored, out}
