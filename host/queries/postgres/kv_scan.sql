-- $1 collection: every key and value, for inspection and tests
SELECT key, value FROM kv WHERE collection = $1 ORDER BY key
