-- Settle deliveries of Celery tasks held in Idem's unacked hash. A tag no
-- longer there (acked already, or restored after its visibility ended and
-- taken by another worker) changes nothing.
--
-- KEYS[1]  unacked hash
-- KEYS[2]  unacked index
-- KEYS[3]  delayed set
-- KEYS[4]  delivery counts
-- ARGV[1]  'ack': forget each tag in ARGV[2…]
--          'defer': ARGV[2] tag, ARGV[3] due time (ms), ARGV[4] the
--          envelope to queue then ('' keeps the one taken), ARGV[5] '1' if
--          this delivery does not count (an ETA held back)
--          'extend': ARGV[2] deadline (ms), ARGV[3…] tags
-- Returns how many tags were still held.
local unacked, index, delayed, counts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op = ARGV[1]

local function split(item)
  local colon = string.find(item, ':', 1, true)
  local len = tonumber(string.sub(item, 1, colon - 1))
  return string.sub(item, colon + 1, colon + len), string.sub(item, colon + len + 1)
end

if op == 'extend' then
  local held = 0
  for i = 3, #ARGV do
    if redis.call('HEXISTS', unacked, ARGV[i]) == 1 then
      redis.call('ZADD', index, ARGV[2], ARGV[i])
      held = held + 1
    end
  end
  return held
end

if op == 'ack' then
  local held = 0
  for i = 2, #ARGV do
    local item = redis.call('HGET', unacked, ARGV[i])
    if item then
      local _, envelope = split(item)
      redis.call('HDEL', counts, redis.sha1hex(envelope))
      redis.call('HDEL', unacked, ARGV[i])
      held = held + 1
    end
    redis.call('ZREM', index, ARGV[i])
  end
  return held
end

-- defer
local tag = ARGV[2]
local item = redis.call('HGET', unacked, tag)
if not item then return 0 end
local list, envelope = split(item)
if ARGV[4] ~= '' then
  redis.call('HDEL', counts, redis.sha1hex(envelope))
  envelope = ARGV[4]
elseif ARGV[5] == '1' then
  redis.call('HINCRBY', counts, redis.sha1hex(envelope), -1)
end
redis.call('ZADD', delayed, ARGV[3], #list .. ':' .. list .. envelope)
redis.call('HDEL', unacked, tag)
redis.call('ZREM', index, tag)
return 1
