-- The journal entries of a swept claim.
-- ?1 plugin, ?2 key
DELETE FROM journal WHERE plugin = ?1 AND key = ?2
