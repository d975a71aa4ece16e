-- Retire a claim whose attempts are exhausted, whoever held it: dead, and
-- its fence grows, so an execution still holding the old fence (a zombie
-- whose lease ran out) is refused from now on, on every store.
-- $1 plugin, $2 key, $3 reason, $4 now
UPDATE claims SET state = 'dead', fence = fence + 1, owner = NULL, lease_until = 0, last_error = $3, updated_at = $4
WHERE plugin = $1 AND key = $2
RETURNING fence
