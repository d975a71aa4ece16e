-- Change a plugin's recorded key pointer (an operator's decision, once no
-- message of the plugin is in flight).
-- ?1 plugin, ?2 key pointer, ?3 now
INSERT INTO key_pointers (plugin, key_pointer, recorded_at) VALUES (?1, ?2, ?3)
ON CONFLICT (plugin) DO UPDATE SET key_pointer = EXCLUDED.key_pointer, recorded_at = EXCLUDED.recorded_at
