-- Inside a write's transaction: the claim row is share-locked until commit,
-- so a takeover (which updates it) waits for the write, or the write sees
-- the takeover and is refused.
-- $1 plugin, $2 key, $3 fence
SELECT 1 FROM claims WHERE plugin = $1 AND key = $2 AND fence = $3 AND state = 'running'
FOR SHARE
