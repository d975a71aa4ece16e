-- ?1 id: its message, dead-lettered again, is recorded again
UPDATE dead_letters SET delivery = NULL WHERE id = ?1
