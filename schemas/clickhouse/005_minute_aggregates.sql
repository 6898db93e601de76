-- Per-minute aggregates that dashboards read instead of raw rows.
-- Sums are SimpleAggregateFunction(sum, UInt64): read them with sum(); distinct counts are
-- uniq states: read them with uniqMerge(). Always GROUP BY the key when reading: rows of one
-- key are only merged in the background.
-- The targets keep a deduplication window too, so a retried insert (same dedup token)
-- does not count twice here either.

CREATE TABLE IF NOT EXISTS {database}.attempts_by_source_minute
(
    tenant    LowCardinality(String),
    minute    DateTime('UTC'),
    source    String,
    attempts  SimpleAggregateFunction(sum, UInt64),
    failures  SimpleAggregateFunction(sum, UInt64),
    accounts  AggregateFunction(uniq, String)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (tenant, minute, source)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.attempts_by_source_minute_mv
TO {database}.attempts_by_source_minute
AS SELECT
    tenant,
    toStartOfMinute(ts) AS minute,
    source,
    toUInt64(sum(weight)) AS attempts,
    toUInt64(sumIf(weight, outcome = 'failure')) AS failures,
    uniqStateIf(account_digest, account_digest != '') AS accounts
FROM {database}.attempts
GROUP BY tenant, minute, source;

CREATE TABLE IF NOT EXISTS {database}.attempts_by_account_minute
(
    tenant          LowCardinality(String),
    minute          DateTime('UTC'),
    account_digest  String,
    attempts        SimpleAggregateFunction(sum, UInt64),
    failures        SimpleAggregateFunction(sum, UInt64),
    sources         AggregateFunction(uniq, String)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (tenant, minute, account_digest)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.attempts_by_account_minute_mv
TO {database}.attempts_by_account_minute
AS SELECT
    tenant,
    toStartOfMinute(ts) AS minute,
    account_digest,
    toUInt64(sum(weight)) AS attempts,
    toUInt64(sumIf(weight, outcome = 'failure')) AS failures,
    uniqState(source) AS sources
FROM {database}.attempts
WHERE account_digest != ''
GROUP BY tenant, minute, account_digest;

CREATE TABLE IF NOT EXISTS {database}.attempts_by_flow_minute
(
    tenant    LowCardinality(String),
    minute    DateTime('UTC'),
    flow      LowCardinality(String),
    outcome   LowCardinality(String),
    decision  LowCardinality(String),
    attempts  SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (tenant, minute, flow, outcome, decision)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.attempts_by_flow_minute_mv
TO {database}.attempts_by_flow_minute
AS SELECT
    tenant,
    toStartOfMinute(ts) AS minute,
    flow,
    outcome,
    decision,
    toUInt64(sum(weight)) AS attempts
FROM {database}.attempts
GROUP BY tenant, minute, flow, outcome, decision;

CREATE TABLE IF NOT EXISTS {database}.dead_letters_by_minute
(
    minute   DateTime('UTC'),
    stage    LowCardinality(String),
    reason   LowCardinality(String),
    messages SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (minute, stage, reason)
TTL minute + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;

CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.dead_letters_by_minute_mv
TO {database}.dead_letters_by_minute
AS SELECT
    toStartOfMinute(ts) AS minute,
    stage,
    reason,
    count() AS messages
FROM {database}.dead_letters
GROUP BY minute, stage, reason;
