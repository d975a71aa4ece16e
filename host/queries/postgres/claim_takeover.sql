-- $1 plugin, $2 key, $3 expected fence, $4 owner, $5 lease_until, $6 plugin_version, $7 now
UPDATE claims
SET state = 'running', fence = fence + 1, attempts = attempts + 1, owner = $4,
    lease_until = $5, plugin_version = $6, updated_at = $7
WHERE plugin = $1 AND key = $2 AND fence = $3
RETURNING fence, attempts, traps
