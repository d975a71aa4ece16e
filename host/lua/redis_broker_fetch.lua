-- Take up to ARGV[3] deliveries for one consumer: first, when ARGV[7] is
-- '1', entries whose visibility ran out (their consumer died or gave up),
-- then new entries.
-- KEYS[1]  stream
-- ARGV[1]  consumer group
-- ARGV[2]  consumer (this broker instance)
-- ARGV[3]  most deliveries to return (>= 1)
-- ARGV[4]  claim horizon (ms): XAUTOCLAIM takes entries idle this long
-- ARGV[5]  idle time (ms) to give each delivery: horizon - visibility, so
--          it becomes claimable exactly when its own visibility ends
-- ARGV[6]  XAUTOCLAIM cursor to resume the scan of the pending list from
-- ARGV[7]  '1': scan the pending list for expired deliveries (XAUTOCLAIM)
--          and trim settled entries from the stream's head; '0': neither.
--          Both walk the stream (Redis checks every pending entry it scans
--          still exists), so the client asks for them about once a second,
--          not on every fetch.
-- Returns {next cursor (ARGV[6] when not scanned),
--          last entry id ("" unless nothing was taken),
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
local scan = ARGV[7] == '1'
local out, ids = {}, {}

local claimed = {ARGV[6], {}}
if scan then
  claimed = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[4], ARGV[6], 'COUNT', max)
end
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

-- Settled entries are acked, not deleted one by one (XDEL walks the
-- stream for each): the head of the stream below the oldest pending
-- delivery is settled, and goes here, in whole nodes. With nothing pending
-- everything the group has read is settled, and goes exactly.
if scan then
  local oldest = redis.call('XPENDING', stream, group, '-', '+', 1)
  if oldest[1] then
    redis.call('XTRIM', stream, 'MINID', '~', oldest[1][1])
  else
    for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
      local info = {}
      for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
      if info['name'] == group then
        -- Up to the id right after it (a sequence too long for Lua's
        -- numbers to add one to exactly: in whole nodes, below it).
        local last_read = info['last-delivered-id']
        local ms, seq = string.match(last_read, '^(%d+)-(%d+)$')
        if ms and #seq <= 15 then
          redis.call('XTRIM', stream, 'MINID', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
        else
          redis.call('XTRIM', stream, 'MINID', '~', last_read)
        end
      end
    end
  end
end

-- Nothing to take: tell the client where the stream ends, so it can block
-- on XREAD for anything newer without missing an entry added in between.
local last = ''
if #out == 0 then
  local tail = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  last = (tail[1] and tail[1][1]) or '0-0'
end
return {claimed[1], last, out}
