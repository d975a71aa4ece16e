-- Mark running claims done, each only if its fence is current.
-- KEYS[1]   hash of claim counts by state
-- KEYS[1+i] claim hash
-- ARGV[1]   now, ARGV[1+i] fence of claim i
-- Returns per claim: 1 confirmed, 0 stale
local out = {}
for i = 2, #KEYS do
  local c = redis.call('HMGET', KEYS[i], 'fence', 'state')
  if c[1] and tonumber(c[1]) == tonumber(ARGV[i]) and c[2] == 'running' then
    redis.call('HSET', KEYS[i], 'state', 'done', 'owner', '', 'lease_until', 0, 'last_error', '', 'updated_at', ARGV[1])
    redis.call('HINCRBY', KEYS[1], 'running', -1)
    redis.call('HINCRBY', KEYS[1], 'done', 1)
    out[i - 1] = 1
  else
    out[i - 1] = 0
  end
end
return out
