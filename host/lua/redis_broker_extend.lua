-- Push back the visibility of deliveries this consumer still holds.
-- KEYS[1]  stream
-- ARGV[1]  consumer group
-- ARGV[2]  consumer (this broker instance)
-- ARGV[3]  idle time (ms) to give each delivery: claim horizon - visibility
--          (see redis_broker_fetch.lua)
-- ARGV[4..] entry id, times delivered by the group, ... (from the receipts)
-- Returns the number of deliveries extended. A delivery taken over by
-- another consumer, re-queued or acked is left alone.
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local extended = 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local p = redis.call('XPENDING', stream, group, id, id, 1, consumer)
  if p[1] and tonumber(p[1][4]) == tonumber(ARGV[i + 1]) then
    -- JUSTID: does not count as another delivery.
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', ARGV[3], 'JUSTID')
    extended = extended + 1
  end
end
return extended
