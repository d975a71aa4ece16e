-- $1 plugin, $2 key, $3 fence, $4 not_before, $5 error, $6 trapped (0/1), $7 now
UPDATE claims SET state = 'retry', owner = NULL, lease_until = 0, not_before = $4,
    last_error = $5, traps = traps + $6, updated_at = $7
WHERE plugin = $1 AND key = $2 AND fence = $3 AND state = 'running'
