-- Write Celery task results and announce each on its own channel, as
-- Celery's Redis result backend does (SET … EX, then PUBLISH).
-- ARGV[1]  seconds a result is kept (Celery's result_expires)
-- per result i: KEYS[i] celery-task-meta-<id>; ARGV[2i] 'NX' to write only
-- if no result is stored (a duplicate's answer), '' to overwrite;
-- ARGV[2i+1] the result document
for i = 1, #KEYS do
  local nx, doc = ARGV[2 * i], ARGV[2 * i + 1]
  local set
  if nx == 'NX' then
    set = redis.call('SET', KEYS[i], doc, 'NX', 'EX', ARGV[1])
  else
    set = redis.call('SET', KEYS[i], doc, 'EX', ARGV[1])
  end
  if set then redis.call('PUBLISH', KEYS[i], doc) end
end
return #KEYS
