-- ?1 msg_id, ?2 handler, ?3 headers (JSON), ?4 payload, ?5 visible_at, ?6 now
INSERT INTO queue (msg_id, handler, headers, payload, visible_at, enqueued_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
