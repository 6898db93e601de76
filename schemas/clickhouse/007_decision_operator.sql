-- Operators' decisions (`authpipe decisions add`, rule `manual`) record who decided and why.
-- Null for the rules' own decisions and for tombstones.
ALTER TABLE {database}.decisions ADD COLUMN IF NOT EXISTS operator Nullable(String) AFTER tombstone;
ALTER TABLE {database}.decisions ADD COLUMN IF NOT EXISTS reason Nullable(String) AFTER operator;
