-- ?1 plugin, ?2 key, ?3 fence, ?4 lease_until, ?5 now
-- An extension never shortens a lease.
UPDATE claims SET lease_until = MAX(lease_until, ?4), updated_at = ?5
WHERE plugin = ?1 AND key = ?2 AND fence = ?3 AND state = 'running'
