-- $1 plugin, $2 key, $3 now, $4 payload hash of the dead letter
-- A dead claim's fresh start for a dead-letter replay: no attempts or traps
-- counted, due now. The payload hash stays.
UPDATE claims SET state = 'retry', owner = NULL, lease_until = 0, not_before = 0, attempts = 0, traps = 0,
    last_error = NULL, updated_at = $3
WHERE plugin = $1 AND key = $2 AND state = 'dead' AND payload_hash = $4
