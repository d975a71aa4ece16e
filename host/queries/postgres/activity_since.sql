-- $1: the minutes from this one on, oldest first
SELECT minute, outcome, n FROM activity WHERE minute >= $1 ORDER BY minute, outcome
