-- $1 minute (Unix ms of its start), $2 outcome, $3 count to add
INSERT INTO activity (minute, outcome, n) VALUES ($1, $2, $3)
ON CONFLICT (minute, outcome) DO UPDATE SET n = activity.n + excluded.n
