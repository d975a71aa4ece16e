-- ?1: remove the minutes before this one
DELETE FROM activity WHERE minute < ?1
