-- Take up to ARGV[3] deliveries for one consumer: first entries whose
-- visibility ran out (their consumer died or gave up), then new entries.
-- KEYS[1]  stream
-- ARGV[1]  consumer group
-- ARGV[2]  consumer (this broker instance)
-- ARGV[3]  most deliveries to return (>= 1)
-- ARGV[4]  claim horizon (ms): XAUTOCLAIM takes entries idle this long
-- ARGV[5]  idle time (ms) to give each delivery: horizon - visibility, so
--          it becomes claimable exactly when its own visibility ends
-- ARGV[6]  XAUTOCLAIM cursor to resume the scan of the pending list from
-- Returns {next cursor, last entry id ("" unless nothing was taken),
--          {{entry id, times delivered by the group, {field, value, ...}}, ...}}
--
-- Redis measures visibility as idle time and lets the claimer choose the
-- threshold. Idem's contract is per delivery (a fetch with a short
-- visibility must not shorten anyone else's), so every claimer uses the
-- same horizon and each delivery's idle clock is started at
-- horizon - visibility. Doing it in this script means no delivery is ever
-- pending without its visibility set, even if the client dies mid-fetch.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local max = tonumber(ARGV[3])
local out, ids = {}, {}

local claimed = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[4], ARGV[6], 'COUNT', max)
for _, entry in ipairs(claimed[2]) do
  -- Entries deleted from the stream come back as nil on Redis 6.2.
  if type(entry) == 'table' and type(entry[2]) == 'table' then
    local p = redis.call('XPENDING', stream, group, entry[1], entry[1], 1)
    local count = (p[1] and p[1][4]) or 1
    out[#out + 1] = {entry[1], count, entry[2]}
    ids[#ids + 1] = entry[1]
  end
end

if #out < max then
  local read = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', max - #out, 'STREAMS', stream, '>')
  if read and read[1] then
    for _, entry in ipairs(read[1][2]) do
      if type(entry[2]) == 'table' then
        out[#out + 1] = {entry[1], 1, entry[2]}
        ids[#ids + 1] = entry[1]
      end
    end
  end
end

-- JUSTID: does not count as another delivery. In chunks, as unpack() is
-- limited by Lua's stack.
for first = 1, #ids, 1000 do
  local args = {'XCLAIM', stream, group, consumer, 0}
  for i = first, math.min(first + 999, #ids) do args[#args + 1] = ids[i] end
  args[#args + 1] = 'IDLE'
  args[#args + 1] = ARGV[5]
  args[#args + 1] = 'JUSTID'
  redis.call(unpack(args))
end

-- Nothing to take: tell the client where the stream ends, so it can block
-- on XREAD for anything newer without missing an entry added in between.
local last = ''
if #out == 0 then
  local tail = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  last = (tail[1] and tail[1][1]) or '0-0'
end
return {claimed[1], last, out}
