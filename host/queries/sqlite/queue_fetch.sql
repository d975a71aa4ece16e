-- Lease up to ?3 visible rows to one consumer: each becomes invisible until
-- ?2 and carries the receipt ?4, which nack and extend must present.
-- ?1 now, ?2 visible_at, ?3 limit, ?4 receipt
UPDATE queue SET visible_at = ?2, deliveries = deliveries + 1, receipt = ?4
WHERE id IN (SELECT id FROM queue WHERE visible_at <= ?1 ORDER BY visible_at, id LIMIT ?3)
RETURNING id, msg_id, handler, headers, payload, deliveries
