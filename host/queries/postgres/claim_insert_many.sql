-- A batch of new keys, in one statement: each is acquired with fence 1.
-- Rows are inserted in key order, byte by byte whatever the database's
-- collation (the one order in which every statement and transaction that
-- locks several claim rows takes them), so two workers inserting
-- overlapping batches, or this statement and a claim transaction inserting
-- keys one by one, queue behind each other instead of deadlocking. A key
-- that exists (or that another worker inserts first) is skipped and not
-- returned: the caller locks and decides it on its own. The keys of one
-- batch are unique.
-- $1 plugins, $2 keys, $3 msg_ids, $4 payload_hashes, $5 owners,
-- $6 lease_untils, $7 plugin_versions, $8 now
INSERT INTO claims (plugin, key, msg_id, payload_hash, state, fence, owner, lease_until, attempts, plugin_version, created_at, updated_at)
SELECT plugin, key, msg_id, payload_hash, 'running', 1, owner, lease_until, 1, plugin_version, $8, $8
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[])
    AS t(plugin, key, msg_id, payload_hash, owner, lease_until, plugin_version)
ORDER BY plugin COLLATE "C", key COLLATE "C"
ON CONFLICT (plugin, key) DO NOTHING
RETURNING plugin, key
