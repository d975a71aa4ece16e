-- Write Celery task results and announce each on its own channel, as
-- Celery's Redis result backend does (SET … EX, then PUBLISH).
-- ARGV[1]  seconds a result is kept (Celery's result_expires)
-- per result i: KEYS[i] celery-task-meta-<id>; ARGV[2i] what it may
-- replace: 'always', 'never' (written only where no result is stored: a
-- duplicate's answer) or 'unless-final' (not a SUCCESS, FAILURE or
-- REVOKED: a failure must not overwrite how a task with the same id
-- ended); ARGV[2i+1] the result document
local final = {SUCCESS = true, FAILURE = true, REVOKED = true}
for i = 1, #KEYS do
  local overwrite, doc = ARGV[2 * i], ARGV[2 * i + 1]
  local set
  if overwrite == 'never' then
    set = redis.call('SET', KEYS[i], doc, 'NX', 'EX', ARGV[1])
  elseif overwrite == 'unless-final' then
    local stored = redis.call('GET', KEYS[i])
    local ok, meta = pcall(cjson.decode, stored or '')
    if not (stored and ok and type(meta) == 'table' and final[meta['status']]) then
      set = redis.call('SET', KEYS[i], doc, 'EX', ARGV[1])
    end
  elseif overwrite == 'always' then
    set = redis.call('SET', KEYS[i], doc, 'EX', ARGV[1])
  else
    return redis.error_reply('celery_result: unknown overwrite mode ' .. tostring(overwrite))
  end
  if set then redis.call('PUBLISH', KEYS[i], doc) end
end
return #KEYS
