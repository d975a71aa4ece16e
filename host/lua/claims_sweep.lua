-- Retention sweep: settled claims (done, dead) last changed before a time,
-- with their journals, and dead letters that died before another; at most
-- `limit` of each, oldest first. Running claims and claims waiting for a
-- retry are never removed (a revived claim left the settled set), nor is a
-- dead claim while its dead letter is kept: a replay revives it, its
-- journal answering the calls it made; it is looked at again a window
-- later.
-- KEYS[1] hash of counts, KEYS[2] sorted set of settled claims by time,
-- KEYS[3] list of dead-letter ids (newest first)
-- ARGV[1] settled before (ms), ARGV[2] limit, ARGV[3] claim key prefix,
-- ARGV[4] journal key prefix, ARGV[5] dead letters before (ms, '' = keep),
-- ARGV[6] key prefix of dead-letter hashes
-- Returns {dead letters removed, {claim key suffix, ...}}
local before, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local swept = {}
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. before, 'LIMIT', 0, limit)
for _, ck in ipairs(old) do
  redis.call('ZREM', KEYS[2], ck)
  local c = redis.call('HMGET', ck, 'state', 'updated_at', 'dead_letter')
  if c[1] == 'dead' and c[3] and redis.call('EXISTS', ARGV[6] .. c[3]) == 1 then
    local t = redis.call('TIME')
    redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ck)
  elseif (c[1] == 'done' or c[1] == 'dead') and tonumber(c[2]) < before then
    local suffix = string.sub(ck, #ARGV[3] + 1)
    local jk = ARGV[4] .. suffix
    local steps = math.floor(redis.call('HLEN', jk) / 2)
    redis.call('DEL', ck, jk)
    redis.call('HINCRBY', KEYS[1], c[1], -1)
    if steps > 0 then
      redis.call('HINCRBY', KEYS[1], 'journal', -steps)
    end
    swept[#swept + 1] = suffix
  end
end
local dead = 0
if ARGV[5] ~= '' then
  local dl_before = tonumber(ARGV[5])
  while dead < limit do
    local id = redis.call('LINDEX', KEYS[3], -1)
    if not id then
      break
    end
    local at = tonumber(redis.call('HGET', ARGV[6] .. id, 'dead_at'))
    if at and at >= dl_before then
      break
    end
    redis.call('RPOP', KEYS[3])
    local delivery = redis.call('HGET', ARGV[6] .. id, 'delivery')
    if delivery and redis.call('GET', delivery) == id then
      redis.call('DEL', delivery)
    end
    redis.call('DEL', ARGV[6] .. id)
    dead = dead + 1
  end
end
return {dead, swept}
