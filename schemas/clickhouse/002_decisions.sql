-- Throttle decisions as published on the compacted decisions topic.
-- A lifted decision (a tombstone on the topic) is a row with tombstone = true and the key.
CREATE TABLE IF NOT EXISTS {database}.decisions
(
    decision_id     String,
    key             String,
    tenant          LowCardinality(String),
    scope           LowCardinality(String),
    account_digest  Nullable(String),
    source          Nullable(String),
    device_id       Nullable(String),
    applies_to      LowCardinality(String),
    action          LowCardinality(String),
    rule            LowCardinality(String),
    count           UInt32,
    threshold       UInt32,
    window_ms       UInt64,
    issued_at       DateTime64(3, 'UTC'),
    expires_at      DateTime64(3, 'UTC'),
    policy_version  LowCardinality(String),
    tombstone       Bool,
    kafka_topic     LowCardinality(String),
    kafka_partition UInt16,
    kafka_offset    UInt64
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(issued_at)
ORDER BY (tenant, issued_at, key)
SETTINGS non_replicated_deduplication_window = 1000;
