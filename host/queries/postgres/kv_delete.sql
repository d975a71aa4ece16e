DELETE FROM kv WHERE collection = $1 AND key = $2
