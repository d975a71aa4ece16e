-- Record a plugin's key pointer the first time it is seen; answer the one
-- recorded ('' = the message id).
-- $1 plugin, $2 key pointer, $3 now
INSERT INTO key_pointers (plugin, key_pointer, recorded_at) VALUES ($1, $2, $3)
ON CONFLICT (plugin) DO UPDATE SET plugin = EXCLUDED.plugin
RETURNING key_pointer
