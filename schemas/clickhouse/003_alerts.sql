-- Alerts, once per subject per window.
CREATE TABLE IF NOT EXISTS {database}.alerts
(
    alert_id          String,
    type              LowCardinality(String),
    tenant            LowCardinality(String),
    source            Nullable(String),
    account_digest    Nullable(String),
    count             UInt64,
    distinct_accounts UInt64,
    window_start      DateTime64(3, 'UTC'),
    window_end        DateTime64(3, 'UTC'),
    policy_version    LowCardinality(String),
    kafka_topic       LowCardinality(String),
    kafka_partition   UInt16,
    kafka_offset      UInt64
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(window_start)
ORDER BY (tenant, window_start, type)
SETTINGS non_replicated_deduplication_window = 1000;
