SELECT request_hash, response FROM journal WHERE plugin = $1 AND key = $2 AND step = $3
