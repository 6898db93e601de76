-- Challenge decisions (issue 24) name what they demand: captcha or step_up.
-- Null for every other decision and for tombstones.
ALTER TABLE {database}.decisions ADD COLUMN IF NOT EXISTS challenge Nullable(String) AFTER reason;
