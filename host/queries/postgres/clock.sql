-- The server's clock in ms since the Unix epoch: the time every worker
-- measures leases with. (clock_timestamp, not now: the time of the call,
-- not of the transaction's start.)
SELECT (extract(epoch from clock_timestamp()) * 1000)::BIGINT
