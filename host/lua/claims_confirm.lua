-- Mark running claims done, each only if its fence is current, storing the
-- handler's result with it.
-- KEYS[1]   hash of claim counts by state
-- KEYS[1+i] claim hash
-- KEYS[#KEYS] sorted set of settled claims by time (retention)
-- ARGV[1]   now; ARGV[2i] fence of claim i; ARGV[2i+1] its result, stored
--           as '=' .. bytes ('' when the handler returned none)
-- Returns per claim: 1 confirmed, 0 stale
local out = {}
local settled = KEYS[#KEYS]
for i = 2, #KEYS - 1 do
  local fence, result = ARGV[2 * (i - 1)], ARGV[2 * (i - 1) + 1]
  local c = redis.call('HMGET', KEYS[i], 'fence', 'state')
  if c[1] and tonumber(c[1]) == tonumber(fence) and c[2] == 'running' then
    redis.call('HSET', KEYS[i], 'state', 'done', 'owner', '', 'lease_until', 0, 'last_error', '', 'updated_at', ARGV[1], 'result', result)
    redis.call('HINCRBY', KEYS[1], 'running', -1)
    redis.call('HINCRBY', KEYS[1], 'done', 1)
    redis.call('ZADD', settled, ARGV[1], KEYS[i])
    out[i - 1] = 1
  else
    out[i - 1] = 0
  end
end
return out
