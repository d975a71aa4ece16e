-- ?1 id
DELETE FROM dead_letters WHERE id = ?1
