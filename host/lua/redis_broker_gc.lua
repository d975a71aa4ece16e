-- Forget consumers (of stopped broker instances) that hold no deliveries.
-- Every instance has its own consumer name, so without this the group
-- would list one consumer per process ever started. A consumer that holds
-- deliveries is kept: deleting it would make them unclaimable.
-- KEYS[1]  stream
-- ARGV[1]  consumer group
-- ARGV[2]  minimum idle time (ms) of a consumer to forget
-- ARGV[3]  consumer to keep (this broker instance)
-- Returns the number of consumers removed.
local removed = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #c, 2 do info[c[i]] = c[i + 1] end
  if info['name'] ~= ARGV[3] and tonumber(info['pending']) == 0 and tonumber(info['idle']) >= tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    removed = removed + 1
  end
end
return removed
