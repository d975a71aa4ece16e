-- Move delayed entries that are due into the stream (atomic: an entry is
-- either still in the delayed set or in the stream, never both, never lost).
-- KEYS[1]  delayed set (ZSET, score = due time in ms, member = encoded entry)
-- KEYS[2]  stream
-- ARGV[1]  now (ms)
-- ARGV[2]  most entries to move in one call (bounds the time Redis is busy)
-- Returns the number of entries moved.
--
-- A member is a sequence of "<length>:<bytes>" items: a unique token (so
-- that two identical entries stay two members), then field, value, ...
-- Lengths make it binary-safe; payloads are arbitrary bytes.
local function decode(member)
  local items, pos = {}, 1
  while pos <= #member do
    local colon = string.find(member, ':', pos, true)
    if not colon then return nil end
    local len = tonumber(string.sub(member, pos, colon - 1))
    if not len or colon + len > #member then return nil end
    items[#items + 1] = string.sub(member, colon + 1, colon + len)
    pos = colon + len + 1
  end
  return items
end

-- Idem writes a token and at most five fields (id, handler, headers,
-- payload, delivered); more items than that are not its own (and thousands
-- would pass Lua's unpack limit).
local MAX_ITEMS = 11

local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(due) do
  local items = decode(member)
  local fields = {}
  if items and #items >= 3 and #items <= MAX_ITEMS and #items % 2 == 1 then
    for i = 2, #items do fields[#fields + 1] = items[i] end
  else
    -- Not written by Idem: deliver the bytes as a payload without a handler,
    -- so the worker dead-letters it as bad input instead of it looping here.
    fields = {'payload', member}
  end
  redis.call('XADD', KEYS[2], '*', unpack(fields))
  redis.call('ZREM', KEYS[1], member)
end
return #due
