-- ?1 id, ?2 receipt, ?3 visible_at
UPDATE queue SET visible_at = ?3 WHERE id = ?1 AND receipt = ?2
