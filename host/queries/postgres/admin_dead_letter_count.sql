SELECT COUNT(*) FROM dead_letters
