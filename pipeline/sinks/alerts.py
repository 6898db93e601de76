"""``authpipe alerts run``: the SQL alert rules of ``dashboards/alerts/``, on a schedule.

A rule is one file ``dashboards/alerts/<type>.sql``: a SELECT over the per-minute
aggregates, with one server-side parameter ``{now_ms:Int64}`` (the evaluation time,
epoch ms UTC), returning one row per firing subject with these columns:

================== ===========================================================
``tenant``         the tenant, or ``*`` for a rule across tenants
``subject``        what fired: the tenant, a source, an account digest
``source``         Nullable(String): the source, when the subject is one
``account_digest`` Nullable(String): the account, when the subject is one
``count``          UInt64: failures, decisions… what the rule counts
``distinct_accounts`` UInt64
``window_start``   DateTime64(3, 'UTC'): the data window evaluated
``window_end``     DateTime64(3, 'UTC')
``period``         DateTime('UTC'): a subject fires at most once per period
================== ===========================================================

Each firing becomes an :class:`~pipeline.contracts.models.Alert` with ``type`` = the
file name, ``alert_id`` = a digest of (rule, tenant, subject, period), so the same
firing always has the same id, and ``policy_version`` = ``rules:<digest of the file>``.

What fired is remembered in the ``alert_firings`` table (migration 006): before
emitting, the runner drops the firings whose alert_id is there; after emitting to Kafka
it records them. A restart therefore never re-fires a subject in the same period. The
order (emit, then record) makes delivery at-least-once: a crash between the two emits
that alert again on restart, with the same alert_id, so consumers can drop it.

Emission: the alerts topic (always; key = alert_id), an optional webhook (HTTP POST of
the Alert JSON, best effort: a failure is logged, not retried) and optional stdout (one
JSON line per alert). A rule whose SQL fails is logged and skipped; the others run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from pipeline.clock import wall_ms
from pipeline.contracts.codec import encode
from pipeline.contracts.models import Alert, datetime_to_ms
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.sinks.clickhouse import ClickHouse, ClickHouseError
from pipeline.sinks.connect import open_clickhouse
from pipeline.topics import Topics

log = get_logger("alerts")

RULES_DIR: Final = Path(__file__).resolve().parents[2] / "dashboards" / "alerts"
FIRINGS_TABLE: Final = "alert_firings"
RULE_COLUMNS: Final = (
    "tenant",
    "subject",
    "source",
    "account_digest",
    "count",
    "distinct_accounts",
    "window_start",
    "window_end",
    "period",
)
FIRING_COLUMNS: Final = (
    "alert_id",
    "rule",
    "tenant",
    "subject",
    "period",
    "window_start",
    "window_end",
    "count",
    "distinct_accounts",
    "fired_at",
)
WEBHOOK_TIMEOUT_S: Final = 10.0
BROKER_WAIT_S: Final = 30.0
_RULE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class AlertRuleError(AuthpipeError):
    """A rule file cannot be used, or the runner cannot run."""


class AlertEmitError(AuthpipeError):
    """Kafka did not take the alerts of a run; they were not recorded as fired."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule file: its name (the alert type), SQL and version (digest of the text)."""

    name: str
    sql: str
    version: str


@dataclass(frozen=True, slots=True)
class Firing:
    """One rule row: the alert to emit and what identifies it."""

    rule: str
    subject: str
    period: datetime
    alert: Alert


def load_rules(directory: Path = RULES_DIR) -> list[Rule]:
    """The ``*.sql`` rules of ``directory``, by name; names must be alert types."""
    if not directory.is_dir():
        raise AlertRuleError(
            f"alert rule directory {directory} does not exist; run from a checkout of authpipe"
        )
    rules = []
    for path in sorted(directory.glob("*.sql")):
        name = path.stem
        if not _RULE_NAME.match(name):
            raise AlertRuleError(
                f"alert rule file {path.name}: the name must be lowercase letters, digits "
                "and underscores (it becomes the alert type); rename it"
            )
        text = path.read_text("utf-8")
        if "{now_ms:Int64}" not in text:
            raise AlertRuleError(
                f"alert rule {path.name} does not use {{now_ms:Int64}}; rules must take the "
                "evaluation time as that parameter, never now()"
            )
        rules.append(Rule(name, text, hashlib.sha256(text.encode()).hexdigest()[:12]))
    if not rules:
        raise AlertRuleError(f"no alert rules (*.sql) in {directory}")
    return rules


def alert_id_for(rule: str, tenant: str, subject: str, period: datetime) -> str:
    """The deterministic id of a firing: same rule, tenant, subject and period → same id."""
    text = f"{rule}|{tenant}|{subject}|{datetime_to_ms(period)}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def firing_from_row(rule: Rule, row: dict[str, Any]) -> Firing:
    """A rule's result row as a Firing; a row that breaks the contract raises."""
    missing = [name for name in RULE_COLUMNS if name not in row]
    if missing:
        raise AlertRuleError(
            f"alert rule {rule.name} returned no {', '.join(missing)}; "
            f"return every column of the contract: {', '.join(RULE_COLUMNS)}"
        )
    tenant, subject, period = str(row["tenant"]), str(row["subject"]), row["period"]
    alert = Alert(
        alert_id=alert_id_for(rule.name, tenant, subject, period),
        type=rule.name,
        tenant=tenant,
        source=row["source"],
        account_digest=row["account_digest"],
        count=int(row["count"]),
        distinct_accounts=int(row["distinct_accounts"]),
        window_start=row["window_start"],
        window_end=row["window_end"],
        policy_version=f"rules:{rule.version}",
    )
    return Firing(rule.name, subject, period, alert)


def evaluate(ch: ClickHouse, rules: Sequence[Rule], now_ms: int) -> list[Firing]:
    """Every rule at ``now_ms``; a rule that fails is logged and skipped."""
    firings: list[Firing] = []
    for rule in rules:
        try:
            rows = ch.query_dicts(rule.sql, {"now_ms": now_ms})
            firings.extend(firing_from_row(rule, row) for row in rows)
        except (ClickHouseError, AlertRuleError) as exc:
            if isinstance(exc, ClickHouseError) and _unavailable(exc):
                raise
            log.error("alerts_rule_failed", rule=rule.name, error=str(exc)[:500])
    return firings


def _unavailable(exc: ClickHouseError) -> bool:
    from pipeline.sinks.clickhouse import ClickHouseUnavailable

    return isinstance(exc, ClickHouseUnavailable)


def fired_ids(ch: ClickHouse, alert_ids: Sequence[str]) -> set[str]:
    """Which of ``alert_ids`` were emitted already (recorded in alert_firings)."""
    if not alert_ids:
        return set()
    rows = ch.query(
        f"SELECT DISTINCT alert_id FROM {FIRINGS_TABLE} WHERE alert_id IN {{ids:Array(String)}}",
        {"ids": list(alert_ids)},
    )
    return {str(row[0]) for row in rows}


def record_firings(ch: ClickHouse, firings: Sequence[Firing], fired_at_ms: int) -> None:
    """Remember emitted firings (the dedup token makes a retried record a no-op)."""
    if not firings:
        return
    rows = [
        [
            f.alert.alert_id,
            f.rule,
            f.alert.tenant,
            f.subject,
            f.period,
            f.alert.window_start,
            f.alert.window_end,
            f.alert.count,
            f.alert.distinct_accounts,
            fired_at_ms,
        ]
        for f in firings
    ]
    token = (
        "alert-firings:"
        + hashlib.sha256(",".join(sorted(f.alert.alert_id for f in firings)).encode()).hexdigest()
    )
    ch.insert(FIRINGS_TABLE, FIRING_COLUMNS, rows, dedup_token=token)


class AlertRunner:
    """Evaluate, drop what fired, emit, remember; ``run_once`` is one evaluation."""

    def __init__(
        self,
        settings: Settings,
        *,
        rules: Sequence[Rule] | None = None,
        webhook: str | None = None,
        to_stdout: bool = False,
        open_ch: Callable[[], ClickHouse] | None = None,
    ) -> None:
        self.settings = settings
        self.rules = list(rules) if rules is not None else load_rules()
        self.webhook = webhook
        self.to_stdout = to_stdout
        self._open_ch = open_ch or (lambda: open_clickhouse(settings.clickhouse))
        self._ch: ClickHouse | None = None
        self._producer: Any = None
        self._http: Any = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        from pipeline.kafka_admin import ensure_topics, wait_for_broker
        from pipeline.kafka_client import producer_kwargs, security_kwargs

        kafka = self.settings.kafka
        bootstrap = kafka.bootstrap_servers
        security = security_kwargs(kafka)
        try:
            await wait_for_broker(bootstrap, BROKER_WAIT_S, security=security)
            specs = Topics.from_settings(kafka).specs(kafka.partitions)
            await ensure_topics(
                bootstrap,
                [spec for spec in specs if spec.name == kafka.alerts_topic],
                replication_factor=kafka.replication_factor,
                security=security,
            )
        except AuthpipeError as exc:
            raise AlertRuleError(f"alerts run cannot reach Kafka: {exc}") from exc
        self._producer = AIOKafkaProducer(**producer_kwargs(kafka))
        await self._producer.start()
        if self.webhook:
            import aiohttp

            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT_S)
            )

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._ch is not None:
            ch, self._ch = self._ch, None
            await asyncio.to_thread(ch.close)

    async def run_once(self, now_ms: int) -> list[Alert]:
        """Evaluate every rule at ``now_ms``; emit and record the new firings."""
        if self._ch is None:
            self._ch = await asyncio.to_thread(self._open_ch)
        ch = self._ch
        firings = await asyncio.to_thread(evaluate, ch, self.rules, now_ms)
        unique = {f.alert.alert_id: f for f in firings}
        done = await asyncio.to_thread(fired_ids, ch, list(unique))
        new = [f for alert_id, f in unique.items() if alert_id not in done]
        from aiokafka.errors import KafkaError

        try:
            for firing in new:
                await self._producer.send_and_wait(
                    self.settings.kafka.alerts_topic,
                    value=encode(firing.alert),
                    key=firing.alert.alert_id.encode(),
                )
        except KafkaError as exc:
            raise AlertEmitError(
                f"could not send alerts to {self.settings.kafka.alerts_topic} ({exc}); "
                "nothing was recorded, the next run sends them again"
            ) from exc
        for firing in new:
            await self._side_channels(firing.alert)
        await asyncio.to_thread(record_firings, ch, new, wall_ms())
        for firing in new:
            log.info(
                "alerts_fired",
                rule=firing.rule,
                tenant=firing.alert.tenant,
                subject=firing.subject,
                alert_id=firing.alert.alert_id,
                count=firing.alert.count,
            )
        log.info(
            "alerts_evaluated",
            rules=len(self.rules),
            firing=len(unique),
            new=len(new),
            already_fired=len(unique) - len(new),
        )
        return [f.alert for f in new]

    async def _side_channels(self, alert: Alert) -> None:
        body = encode(alert)
        if self.to_stdout:
            sys.stdout.write(body.decode() + "\n")
            sys.stdout.flush()
        if self._http is not None and self.webhook:
            try:
                async with self._http.post(
                    self.webhook, data=body, headers={"Content-Type": "application/json"}
                ) as response:
                    if response.status >= 300:
                        log.warning(
                            "alerts_webhook_failed",
                            status=response.status,
                            alert_id=alert.alert_id,
                        )
            except Exception as exc:  # the webhook is best effort: never stop the runner
                log.warning("alerts_webhook_failed", error=str(exc)[:300], alert_id=alert.alert_id)

    async def run(self, stop: asyncio.Event, interval_s: float) -> None:
        """Evaluate every ``interval_s`` until ``stop``; ClickHouse outages skip a run."""
        while not stop.is_set():
            try:
                await self.run_once(wall_ms())
            except AlertEmitError as exc:
                log.warning("alerts_run_failed", error=str(exc)[:500], retry_in_s=interval_s)
            except ClickHouseError as exc:
                log.warning("alerts_run_failed", error=str(exc)[:500], retry_in_s=interval_s)
                if self._ch is not None:
                    ch, self._ch = self._ch, None
                    await asyncio.to_thread(ch.close)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)


def run_alerts_command(
    settings: Settings,
    *,
    once: bool,
    interval_s: float,
    webhook: str | None,
    to_stdout: bool,
) -> int:
    """``authpipe alerts run``: evaluate once, or every ``interval_s`` until stopped."""
    rules = load_rules()

    async def main() -> None:
        runner = AlertRunner(settings, rules=rules, webhook=webhook, to_stdout=to_stdout)
        await runner.start()
        try:
            if once:
                await runner.run_once(wall_ms())
                return
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            log.info("alerts_started", rules=[r.name for r in rules], interval_s=interval_s)
            await runner.run(stop, interval_s)
        finally:
            await runner.stop()

    asyncio.run(main())
    return 0
