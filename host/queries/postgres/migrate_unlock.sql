SELECT pg_advisory_unlock(hashtext(current_schema()))
