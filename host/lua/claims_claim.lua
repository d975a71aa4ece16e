-- Claim a batch of deliveries (one round trip, atomic).
-- KEYS[1]   hash of claim counts by state
-- KEYS[2]   dead-letter id sequence
-- KEYS[3]   list of dead-letter ids, newest first
-- KEYS[3+i] claim hash of request i
-- KEYS[#KEYS] sorted set of settled claims by time (retention)
-- ARGV[1]   now (ms)
-- ARGV[2]   key prefix of dead-letter hashes
-- ARGV[3+10(i-1) ..] per request: plugin, key, msg_id, payload_hash, owner,
--           lease_until (ms), max_attempts, plugin_version, headers (JSON),
--           payload
--
-- Most keys are new: one is found so by reading its state alone (reading
-- all nine fields of a missing hash returns nine nils to convert), and its
-- hash is written from the arguments as they came and string constants
-- (Redis formats every Lua number passed to a command). Both together are
-- about a third of this script's time per new key.
-- Returns per request: {"acquired", fence, attempt, traps} | {"done"} |
--   {"dead"} | {"busy", retry_after_ms} | {"conflict"} | {"exhausted", attempts, retired fence}
local now_text = ARGV[1]
local now = tonumber(now_text)
local dl_prefix = ARGV[2]
local out = {}

-- The key naming a conflicting delivery: its plugin, key, message id and
-- payload hash, length-prefixed and hashed.
local function conflict_delivery(plugin, key, msg_id, hash)
  local parts = {}
  for _, p in ipairs({plugin, key, msg_id, hash}) do
    parts[#parts + 1] = #p .. ':' .. p
  end
  return dl_prefix .. 'delivery:' .. redis.sha1hex(table.concat(parts))
end

-- The counts' changes, applied once at the end (one HINCRBY per state
-- rather than two per claim).
local delta = {}
local function add(state, n)
  delta[state] = (delta[state] or 0) + n
end
local function move(from, to)
  if from ~= to then
    add(from, -1)
    add(to, 1)
  end
end

local settled = KEYS[#KEYS]
for i = 1, #KEYS - 4 do
  local b = 2 + (i - 1) * 10
  local plugin, key, msg_id, hash, owner = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local lease, max_attempts, version = ARGV[b + 6], tonumber(ARGV[b + 7]), ARGV[b + 8]
  local headers, payload = ARGV[b + 9], ARGV[b + 10]
  local ck = KEYS[3 + i]
  local c = {}
  if redis.call('HGET', ck, 'state') then
    c = redis.call('HMGET', ck, 'payload_hash', 'state', 'fence', 'lease_until', 'not_before',
      'attempts', 'traps', 'last_error', 'created_at')
  end
  if not c[2] then
    redis.call('HSET', ck, 'msg_id', msg_id, 'payload_hash', hash, 'state', 'running', 'fence', '1',
      'owner', owner, 'lease_until', lease, 'not_before', '0', 'attempts', '1', 'traps', '0',
      'plugin_version', version, 'created_at', now_text, 'updated_at', now_text)
    add('running', 1)
    out[i] = {'acquired', 1, 1, 0}
  elseif c[1] ~= hash then
    local reason = 'conflict: key "' .. key .. '" of plugin ' .. plugin ..
      ' was first seen with a different payload (sha256 ' .. string.sub(c[1], 1, 12) ..
      '…, this delivery ' .. string.sub(hash, 1, 12) .. '…); a reused key is not a duplicate'
    record_dead_letter(dl_prefix, now, plugin, key, msg_id, headers, payload, reason, 0, version, now,
      conflict_delivery(plugin, key, msg_id, hash))
    out[i] = {'conflict'}
  else
    local state, fence = c[2], tonumber(c[3])
    local lease_until, not_before = tonumber(c[4]), tonumber(c[5])
    local attempts, traps = tonumber(c[6]), tonumber(c[7])
    if state == 'done' then
      out[i] = {'done'}
    elseif state == 'dead' then
      out[i] = {'dead'}
    elseif state == 'running' and lease_until > now then
      out[i] = {'busy', lease_until - now}
    elseif state == 'retry' and not_before > now then
      out[i] = {'busy', not_before - now}
    elseif attempts >= max_attempts then
      local last = c[8]
      if not last or last == '' then
        last = 'the worker running it stopped (crash or kill) before settling'
      end
      local reason = 'attempts exhausted: ' .. attempts .. ' of ' .. max_attempts .. ' made; last error: ' .. last
      -- Retired: the fence grows, so a zombie holding the old one is refused.
      redis.call('HSET', ck, 'state', 'dead', 'fence', fence + 1, 'owner', '', 'lease_until', 0,
        'last_error', reason, 'updated_at', now)
      move(state, 'dead')
      redis.call('ZADD', settled, now, ck)
      local id = record_dead_letter(dl_prefix, now, plugin, key, msg_id, headers, payload, reason, attempts, version,
        tonumber(c[9]))
      -- Kept by retention while this record is (see claims_sweep.lua).
      redis.call('HSET', ck, 'dead_letter', id)
      out[i] = {'exhausted', attempts, fence + 1}
    else
      redis.call('HSET', ck, 'state', 'running', 'fence', fence + 1, 'attempts', attempts + 1,
        'owner', owner, 'lease_until', lease, 'plugin_version', version, 'updated_at', now_text)
      move(state, 'running')
      out[i] = {'acquired', fence + 1, attempts + 1, traps}
    end
  end
end
for state, n in pairs(delta) do
  if n ~= 0 then redis.call('HINCRBY', KEYS[1], state, n) end
end
return out
