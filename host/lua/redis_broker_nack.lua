-- Give a delivery back: re-queue a copy of its entry due at ARGV[5] and
-- settle the original, but only if ARGV[2] still holds this delivery (a
-- stale receipt, whose entry was acked, re-queued or taken over, changes
-- nothing).
-- KEYS[1]  stream
-- KEYS[2]  delayed set (ZSET, score = due time in ms)
-- ARGV[1]  consumer group
-- ARGV[2]  consumer (this broker instance)
-- ARGV[3]  entry id
-- ARGV[4]  times delivered by the group, from the receipt
-- ARGV[5]  due time (ms)
-- ARGV[6]  now (ms)
-- Returns 1 if the delivery was given back, 0 if the receipt was stale.
local stream, delayed, group, consumer, id = KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]

local p = redis.call('XPENDING', stream, group, id, id, 1, consumer)
if not p[1] or tonumber(p[1][4]) ~= tonumber(ARGV[4]) then
  return 0
end

local entry = redis.call('XRANGE', stream, id, id)
if entry[1] and type(entry[1][2]) == 'table' then
  -- The copy carries the fields a worker reads, and how often the message
  -- was delivered so far, so the delivery count keeps growing across
  -- re-queues. Other fields (another producer's) are left behind: copied,
  -- thousands of them would pass Lua's unpack limit below.
  -- A field named twice counts once, its last value (as a worker reads it).
  local known, delivered = {}, 0
  local src = entry[1][2]
  for i = 1, #src, 2 do
    local name = src[i]
    if name == 'delivered' then
      delivered = tonumber(src[i + 1]) or 0
    elseif name == 'id' or name == 'handler' or name == 'headers' or name == 'payload' then
      known[name] = src[i + 1]
    end
  end
  local fields = {}
  for _, name in ipairs({'id', 'handler', 'headers', 'payload'}) do
    if known[name] then
      fields[#fields + 1] = name
      fields[#fields + 1] = known[name]
    end
  end
  fields[#fields + 1] = 'delivered'
  fields[#fields + 1] = tostring(delivered + tonumber(p[1][4]))

  if tonumber(ARGV[5]) <= tonumber(ARGV[6]) then
    redis.call('XADD', stream, '*', unpack(fields))
  else
    -- Same encoding as publish (see redis_broker_promote.lua); the entry id
    -- is the unique token.
    local parts = {#id .. ':' .. id}
    for _, f in ipairs(fields) do parts[#parts + 1] = #f .. ':' .. f end
    redis.call('ZADD', delayed, ARGV[5], table.concat(parts))
  end
end

-- Acked, not deleted: the fetch script trims settled entries from the
-- stream's head (see redis_broker_fetch.lua).
redis.call('XACK', stream, group, id)
return 1
