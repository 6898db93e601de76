-- Raw audit rows, one per login attempt (or one summary row per rate-capped key-minute).
-- Placeholders: {database} and {ttl_days} are filled in from settings by pipeline/sinks/migrate.py.
-- Dashboards read the per-minute aggregates (005); this table is for drill-down.
CREATE TABLE IF NOT EXISTS {database}.attempts
(
    ts              DateTime64(3, 'UTC') CODEC(Delta, ZSTD(1)),
    tenant          LowCardinality(String),
    service         LowCardinality(String),
    flow            LowCardinality(String),
    account_digest  String,            -- hex of the keyed BLAKE2b-128 digest, 32 characters
    account         Nullable(String),  -- the typed identifier, only when store_plain_account is on
    source          String,            -- IP or CIDR text, after prefix grouping
    device_id       String,
    trusted         Bool,
    outcome         LowCardinality(String),
    failure_reason  LowCardinality(String),
    decision        LowCardinality(String),  -- applied: allowed, block, observe
    weight          UInt32,            -- attempts the row stands for; summary rows carry more than 1
    summary         Bool,
    policy_version  LowCardinality(String),
    event_id        String,
    kafka_topic     LowCardinality(String),
    kafka_partition UInt16,
    kafka_offset    UInt64,
    INDEX account_digest_bf account_digest TYPE bloom_filter(0.01) GRANULARITY 4,
    INDEX event_id_bf event_id TYPE bloom_filter(0.01) GRANULARITY 4
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (tenant, toStartOfHour(ts), source, account_digest, ts)
TTL toDateTime(ts) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;
