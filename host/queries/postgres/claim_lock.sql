-- Lock the row for the rest of the claim transaction.
SELECT payload_hash, state, fence, lease_until, not_before, attempts, traps, last_error, created_at
FROM claims WHERE plugin = $1 AND key = $2
FOR UPDATE
