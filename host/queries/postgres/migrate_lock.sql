-- Serialises the migrations of workers starting at once, per schema.
SELECT pg_advisory_lock(hashtext(current_schema()))
