-- Extend running claims whose fence is current. An extension never
-- shortens a lease.
-- KEYS[i]   claim hash
-- ARGV[1]   lease_until (ms), ARGV[2] now, ARGV[2+i] fence of claim i
-- Returns per claim: 1 held and extended, 0 stale
local out = {}
for i = 1, #KEYS do
  local c = redis.call('HMGET', KEYS[i], 'fence', 'state', 'lease_until')
  if c[1] and tonumber(c[1]) == tonumber(ARGV[2 + i]) and c[2] == 'running' then
    local lease_until = ARGV[1]
    if (tonumber(c[3]) or 0) > tonumber(ARGV[1]) then
      lease_until = c[3]
    end
    redis.call('HSET', KEYS[i], 'lease_until', lease_until, 'updated_at', ARGV[2])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
