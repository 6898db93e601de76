-- Decisions per minute (for the decision-rate alert rule and dashboards), and the memory
-- of the alert rules runner (`authpipe alerts run`): one row per firing it emitted, so a
-- restart never fires the same subject and period twice.

CREATE TABLE IF NOT EXISTS {database}.decisions_by_minute
(
    tenant     LowCardinality(String),
    minute     DateTime('UTC'),
    scope      LowCardinality(String),
    action     LowCardinality(String),
    rule       LowCardinality(String),
    decisions  SimpleAggregateFunction(sum, UInt64),
    accounts   AggregateFunction(uniq, String)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (tenant, minute, scope, action, rule)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;

-- Tombstones (lifted decisions) are not issued decisions: they are left out.
CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.decisions_by_minute_mv
TO {database}.decisions_by_minute
AS SELECT
    tenant,
    toStartOfMinute(issued_at) AS minute,
    scope,
    action,
    rule,
    count() AS decisions,
    uniqStateIf(assumeNotNull(account_digest), account_digest IS NOT NULL) AS accounts
FROM {database}.decisions
WHERE NOT tombstone
GROUP BY tenant, minute, scope, action, rule;

-- alert_id is deterministic (rule, tenant, subject, period): the runner reads this table
-- before emitting and writes to it after; ReplacingMergeTree folds a rare double write.
CREATE TABLE IF NOT EXISTS {database}.alert_firings
(
    alert_id           String,
    rule               LowCardinality(String),
    tenant             LowCardinality(String),
    subject            String,
    period             DateTime('UTC'),
    window_start       DateTime64(3, 'UTC'),
    window_end         DateTime64(3, 'UTC'),
    count              UInt64,
    distinct_accounts  UInt64,
    fired_at           DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(period)
ORDER BY (rule, tenant, subject, period, alert_id)
TTL period + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000;
