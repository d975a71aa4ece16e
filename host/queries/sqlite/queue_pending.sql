-- Messages not yet acked, visible or in flight.
SELECT COUNT(*) FROM queue
