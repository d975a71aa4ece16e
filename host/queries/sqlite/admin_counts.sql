-- Claims per state.
SELECT state, COUNT(*) AS n FROM claims GROUP BY state
