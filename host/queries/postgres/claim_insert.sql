-- A new key: acquired with fence 1. Two workers inserting at once: one row
-- wins, the other gets nothing back and reads the winner's row.
-- $1 plugin, $2 key, $3 msg_id, $4 payload_hash, $5 owner, $6 lease_until, $7 plugin_version, $8 now
INSERT INTO claims (plugin, key, msg_id, payload_hash, state, fence, owner, lease_until, attempts, plugin_version, created_at, updated_at)
VALUES ($1, $2, $3, $4, 'running', 1, $5, $6, 1, $7, $8, $8)
ON CONFLICT (plugin, key) DO NOTHING
RETURNING fence
