-- Dead letters: one row per message sent to the DLQ topic (the bytes stay in Kafka).
-- kafka_topic/kafka_partition/kafka_offset locate the original message.
CREATE TABLE IF NOT EXISTS {database}.dead_letters
(
    ts              DateTime64(3, 'UTC'),
    reason          LowCardinality(String),
    stage           LowCardinality(String),
    kafka_topic     LowCardinality(String),
    kafka_partition UInt16,
    kafka_offset    UInt64
)
ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (ts, stage, reason)
TTL toDateTime(ts) + INTERVAL {ttl_days} DAY
SETTINGS non_replicated_deduplication_window = 1000, ttl_only_drop_parts = 1;
