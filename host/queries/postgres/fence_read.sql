SELECT COUNT(*) FROM claims WHERE plugin = $1 AND key = $2 AND fence = $3 AND state = 'running'
