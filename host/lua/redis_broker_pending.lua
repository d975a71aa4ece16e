-- Count the messages not yet acked: delivered and pending, not delivered
-- yet (the group's lag), and delayed.
-- KEYS[1]  stream
-- KEYS[2]  delayed set
-- ARGV[1]  consumer group
-- Returns the count.
--
-- Settled entries stay in the stream until a fetch trims them (see
-- redis_broker_fetch.lua), so the stream's length is not the count. Where
-- Redis cannot tell the lag (before Redis 7, or for a while after entries
-- were deleted by hand) the stream's length stands in: exact when nothing
-- is pending, as a fetch's trim then leaves only entries not yet delivered.
local delayed = redis.call('ZCARD', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then
  return delayed
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
  if info['name'] == ARGV[1] and info['lag'] then
    return info['pending'] + info['lag'] + delayed
  end
end
return redis.call('XLEN', KEYS[1]) + delayed
