-- The hot path finds claims by primary key. An index on `state` alone let
-- the planner find running claims through it instead: a bitmap scan of
-- every entry ever made for 'running'. Each claim leaves one behind when it
-- is confirmed, and a bitmap scan cannot mark them dead, so until vacuum
-- every claim, fence check and confirm batch grew with the claims settled
-- since. The console's list of running and retrying claims uses an index
-- on an expression the hot path's conditions never match.
DROP INDEX claims_state;
CREATE INDEX claims_unsettled ON claims ((state IN ('running', 'retry')), plugin);
