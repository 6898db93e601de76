"""Every topic the worker uses, with explicit configs, created at start (idempotently).

| topic | partitions | configs | purpose |
|---|---|---|---|
| ``auth.login-attempts`` | P | delete, 7 days, batches up to 1 MiB | input from login services |
| ``<app>.attempts-by-account`` | P | delete, 1 day | ingest -> account stage (batch envelopes) |
| ``<app>.attempts-by-source`` | P | delete, 1 day | account stage -> source stage |
| ``<app>.tenant-shares`` | P | delete, 1 day | shards' shares of rule 8 -> rollup |
| ``auth.throttle-decisions`` | P | compact, fast segments | decisions and tombstones |
| ``auth.alerts`` | P | delete, 30 days | alerts |
| ``auth.account-notices`` | P | delete, 7 days | owner notices (key: account digest) |
| ``auth.login-attempts.dlq`` | P | delete, 30 days | dead letters, bytes untouched |
| ``auth.audit`` | P | delete, 7 days | audit batches for the ClickHouse sink |

The stages' changelog topics (``<app>-{account,source,rollup}-state-changelog``, compacted,
P partitions; written and read back by the worker itself, not through faust tables) are
created here too, before faust starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.kafka_admin import TopicSpec
from pipeline.settings import KafkaSettings

DAY_MS = 86_400_000

# Compaction must keep up so the decision topic converges to the active decisions and a
# gateway's cold load stays small: short segments and a low dirty ratio let the cleaner
# run often; tombstones are kept a day so an edge offline for less catches every lift
# (longer outages are covered by expires_at, which the edge honours on its own). The last
# hour stays uncompacted so scorecards and backtests can replay recent decisions in order.
DECISIONS_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(60_000),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(DAY_MS),
    "min.compaction.lag.ms": str(3_600_000),
}


# The input's batches, as the broker receives them (compressed): 1 MiB, Kafka's default,
# written out so a broker default raised for other topics does not raise it here. The
# broker bounds only the compressed size; what a batch may inflate to is ingest's bound
# (ingest.max_batch_bytes, pipeline.stream.inflation).
INPUT_MAX_MESSAGE_BYTES = 1_048_576

# The stages' changelogs: compacted so a restore reads the live keys, not the history.
CHANGELOG_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(10 * 60_000),
    "min.cleanable.dirty.ratio": "0.2",
    "delete.retention.ms": str(3_600_000),
}
TABLES = ("account-state", "source-state", "rollup-state")


@dataclass(frozen=True, slots=True)
class Topics:
    """Names of every topic, derived once from the settings."""

    input: str
    by_account: str
    by_source: str
    shares: str
    decisions: str
    alerts: str
    notices: str
    dlq: str
    audit: str
    app_id: str
    min_insync_replicas: int = 1

    @classmethod
    def from_settings(cls, kafka: KafkaSettings) -> Topics:
        prefix = kafka.app_id
        return cls(
            input=kafka.input_topic,
            by_account=f"{prefix}.attempts-by-account",
            by_source=f"{prefix}.attempts-by-source",
            shares=f"{prefix}.tenant-shares",
            decisions=kafka.decisions_topic,
            alerts=kafka.alerts_topic,
            notices=kafka.notices_topic,
            dlq=kafka.dlq_topic,
            audit=kafka.audit_topic,
            app_id=kafka.app_id,
            min_insync_replicas=kafka.min_insync_replicas,
        )

    def changelog(self, table: str) -> str:
        """faust's name for a table's changelog topic."""
        return f"{self.app_id}-{table}-changelog"

    def specs(self, partitions: int) -> list[TopicSpec]:
        """Every topic, each with ``min.insync.replicas`` from the settings (an acks=all write
        is refused while fewer replicas are in sync: never acknowledged, then lost)."""
        isr = {"min.insync.replicas": str(self.min_insync_replicas)}

        def deleting(days: int) -> dict[str, str]:
            return {"cleanup.policy": "delete", "retention.ms": str(days * DAY_MS), **isr}

        return [
            TopicSpec(
                self.input,
                partitions,
                {**deleting(7), "max.message.bytes": str(INPUT_MAX_MESSAGE_BYTES)},
            ),
            TopicSpec(self.by_account, partitions, deleting(1)),
            TopicSpec(self.by_source, partitions, deleting(1)),
            TopicSpec(self.shares, partitions, deleting(1)),
            TopicSpec(self.decisions, partitions, {**DECISIONS_CONFIG, **isr}),
            TopicSpec(self.alerts, partitions, deleting(30)),
            TopicSpec(self.notices, partitions, deleting(7)),
            TopicSpec(self.dlq, partitions, deleting(30)),
            TopicSpec(self.audit, partitions, deleting(7)),
            # Created here, before faust starts, so no client ever sees them missing.
            *(
                TopicSpec(self.changelog(t), partitions, {**CHANGELOG_CONFIG, **isr})
                for t in TABLES
            ),
        ]
