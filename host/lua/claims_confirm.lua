-- Mark running claims done, each only if its fence is current, storing the
-- handler's result with it. A claim already done with that fence is
-- answered confirmed and left as it is (a confirm repeated after its answer
-- was lost: only the holder of a fence confirms with it).
-- KEYS[1]   hash of claim counts by state
-- KEYS[1+i] claim hash
-- KEYS[#KEYS] sorted set of settled claims by time (retention)
-- ARGV[1]   now; ARGV[2i] fence of claim i; ARGV[2i+1] its result, stored
--           as '=' .. bytes ('' when the handler returned none)
-- Returns per claim: 1 confirmed, 0 stale
--
-- The counts and the retention index change once for the batch.
local out = {}
local settled = KEYS[#KEYS]
local index = {}
for i = 2, #KEYS - 1 do
  local fence, result = ARGV[2 * (i - 1)], ARGV[2 * (i - 1) + 1]
  local c = redis.call('HMGET', KEYS[i], 'fence', 'state')
  if c[1] and tonumber(c[1]) == tonumber(fence) and c[2] == 'running' then
    redis.call('HSET', KEYS[i], 'state', 'done', 'owner', '', 'lease_until', '0', 'last_error', '', 'updated_at', ARGV[1], 'result', result)
    index[#index + 1] = ARGV[1]
    index[#index + 1] = KEYS[i]
    out[i - 1] = 1
  elseif c[1] and tonumber(c[1]) == tonumber(fence) and c[2] == 'done' then
    out[i - 1] = 1
  else
    out[i - 1] = 0
  end
end
local confirmed = #index / 2
if confirmed > 0 then
  redis.call('HINCRBY', KEYS[1], 'running', -confirmed)
  redis.call('HINCRBY', KEYS[1], 'done', confirmed)
  -- Score, member pairs in chunks, as unpack() is limited by Lua's stack.
  for first = 1, #index, 1000 do
    local args = {'ZADD', settled}
    for j = first, math.min(first + 999, #index) do args[#args + 1] = index[j] end
    redis.call(unpack(args))
  end
end
return out
