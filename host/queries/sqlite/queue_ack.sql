DELETE FROM queue WHERE id = ?1
