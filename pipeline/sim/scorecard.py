"""``authpipe scorecard``: how well did the policy do against the ground truth?

Inputs: the truth file (labels and the events themselves), the decision stream and the
alerts, from the topics, from files, or computed here by the core ``Engine``.

Which attempts were refused (the simulator models no enforcement, see ``pipeline.sim``)
is found by replaying the decision stream into a ``DecisionIndex`` in event time and
checking every attempt at its ``occurred_at``, exactly as a gateway would have:

* a decision applies from its ``issued_at``: to attempts strictly later in event time
  (from a topic), or from the next attempt (engine runs record the exact position);
* a tombstone lifts its key's decision. Records from a topic carry no event time, so a
  tombstone is placed where the core lifts early: at the first later success that
  clears that key (a password-flow success clears its (account, source) block and, on
  a trusted device, its device block; a uia or mfa success clears its own bucket). A
  tombstone with no such success is an expiry, which ``expires_at`` already enforces;
* on a compacted topic a decision superseded by a later one for the same key may be
  gone; the scorecard then sees only the later one (read soon after a run, or use files).

Per attack (the attacker events of one scenario): the first block (a ``block`` decision
whose key applies to one of its attempts, issued during the attack) and the first
matching alert; time from the attack's first attempt to the earlier of the two; attacker
attempts that got through before it; refused and allowed totals; attacker successes
allowed (account takeovers). Status: ``stopped`` = blocks refused its attempts, no
account was taken over, and at most 10 % of its attempts after the first response got
through; ``slowed`` = blocks refused some attempts but more got through, or an account was
taken over; ``detected_only`` = an alert or a decision (block or observe) matched it but
nothing was refused; else ``missed``. The closing line never says more than that.

Alerts are matched by subject: a source or account alert to the attacks whose attempts
have that source or account, raised between the attack's start and its end plus the
alert's window. ``spray_tenant`` has no subject: it is matched to the attacks that gave
at least 10 % of the distinct failing accounts counted when it fired (the first
``count`` untrusted failing accounts of its window, in event order), provided attackers
gave at least half of them; otherwise it matches no attack (ordinary failures tripped
it: typically a cold start, when the tenant has no trailing baseline yet).

Per attack also: ``guesses_per_account_24h``, the most attacker failures let through
against one account in any 24 h (what a patient attacker gets), and
``account_takeovers``, the accounts with an attacker success let through.

Legitimate attempts refused (roles ``legit`` and ``owner``) are counted per cohort:
``owner_trusted_device``, ``nat_office``, ``ordinary``, ``ipv6_rotating``, ``stale_app``,
``owner_without_trusted_device``. A refusal a seed's rule makes on purpose is counted apart, as
"refused by design" (``BY_DESIGN``: the cohort and the rule that refused it; or a lock
whose run holds an attacker's failures, ``ATTACKED_RUN``), and is not
in ``legit_refused_total``. Blocks of the seed rules (``lockout``, ``mfa_curve``,
``lifetime_bound``) that match no attack and refused nothing legitimate but by design
(an honest mfa typo's one-second wait, a stale app's lock) are counted, not listed.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.contracts.codec import DecodeError, decode_attempt
from pipeline.contracts.models import Alert, Decision, datetime_to_ms, format_utc_ms, ms_to_datetime
from pipeline.core.attempt import Attempt, Normaliser
from pipeline.core.decisions import Active, DecisionIndex, Verdict, keys_for, lock_key
from pipeline.core.engine import Engine
from pipeline.core.errors import InvalidAttempt
from pipeline.core.keys import Key, decision_key, parse_key
from pipeline.core.policy import Policy
from pipeline.core.rollup import TICK_MS
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.settings import Settings
from pipeline.wiring import build_normaliser, load_policy

log = get_logger("scorecard")

LEGIT_ROLES = frozenset({"legit", "owner"})
ATTACKER = "attacker"
UNKNOWN = "unknown"
MIN_ATTACK_SHARE = 0.10
MIN_ATTACKER_SHARE = 0.5
EXAMPLES = 10
DAY_MS = 86_400_000
SEED_RULES = frozenset({"lockout", "mfa_curve", "lifetime_bound"})
BY_DESIGN: dict[tuple[str, str], str] = {
    ("stale_app", "lock"): (
        "seed 002: an app retrying a stale password from changing addresses is "
        "indistinguishable from a guesser, so it is locked like one (untrusted only, an "
        "hour at most; the owner's trusted device and the reset link still work)"
    ),
    ("owner_without_trusted_device", "account"): (
        "the ceiling (rule 2) holds the untrusted world of an account under attack, the "
        "owner without a trusted device included (escalating, an hour at most)"
    ),
    ("owner_without_trusted_device", "lock"): (
        "seed 002: a stranger's failures lock the untrusted world, the owner without a "
        "trusted device included (an hour at most); seed 001's notice mails them a sign-in "
        "link that trusts their device"
    ),
}
"""(cohort, refusing decision's scope) -> why the seeds make that refusal right."""
ATTACKED_RUN = (
    "seed 002: a stranger's failures on this account are in its consecutive run; with the "
    "owner's own untrusted failures they reached the lock, which holds the whole untrusted "
    "world, owner included (an hour at most; trusted devices and the notice's link still work)"
)
"""Why a lock refusal of any legitimate cohort is right when attackers fed the run."""
STALE_APP_RUN = (
    "seed 002: the account's own app, retrying a stale password, fed its consecutive run; "
    "the lock it reached holds every untrusted client of the account (an hour at most; "
    "trusted devices still work, and updating the app's password ends it)"
)
"""Why a lock refusal of the owner is right when their own stale app fed the run."""
TENANT_ALERTS = frozenset({"spray_tenant", "stuffing_tenant"})
"""Alerts without a subject, matched by who gave the accounts they counted."""


class ScorecardError(AuthpipeError):
    """An input of the scorecard (truth, decisions, alerts) is missing or malformed."""


# -- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TruthEvent:
    """One labelled, normalised event; ``index`` is its position in event-time order."""

    index: int
    event_id: str
    scenario: str
    role: str
    actor: str
    cohort: str
    account_plain: str
    attempt: Attempt

    @property
    def occurred_ms(self) -> int:
        return self.attempt.occurred_ms


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One record of the decision stream; ``decision`` None is a tombstone. ``after`` is
    the number of events applied before it was emitted (known for engine runs only)."""

    key: str
    decision: Decision | None
    after: int | None = None


@dataclass(frozen=True, slots=True)
class AlertRecord:
    alert: Alert
    after: int | None = None


@dataclass
class Outputs:
    """A policy's outputs over a run, from wherever they came."""

    origin: str
    decisions: list[DecisionRecord] = field(default_factory=list)
    alerts: list[AlertRecord] = field(default_factory=list)
    verdicts: list[Verdict | None] | None = None  # the engine's own, for cross-checks
    missing_decision_records: int = 0  # offsets of the decision topic compacted away


def load_truth(path: Path, normaliser: Normaliser) -> list[TruthEvent]:
    """Truth rows (or bare wire events, labelled ``unknown``), sorted by event time.

    Lines that are not valid events are counted and skipped with a warning: the worker
    dead-letters them, so they never had a decision either.
    """
    if not path.is_file():
        raise ScorecardError(f"truth file {path} does not exist; write one with authpipe simulate")
    rows: list[tuple[int, int, TruthEvent]] = []
    bad = 0
    with path.open("rb") as handle:
        for number, line in enumerate(handle):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
                event = row.get("event", row) if isinstance(row, dict) else row
                wire = decode_attempt(orjson.dumps(event), max_bytes=1 << 20)
                attempt = normaliser.normalise(wire)
            except (orjson.JSONDecodeError, DecodeError, InvalidAttempt):
                bad += 1
                continue
            labelled = "event" in row
            truth = TruthEvent(
                index=0, event_id=wire.event_id,
                scenario=row.get("scenario", UNKNOWN) if labelled else UNKNOWN,
                role=row.get("role", UNKNOWN) if labelled else UNKNOWN,
                actor=row.get("actor", UNKNOWN) if labelled else UNKNOWN,
                cohort=row.get("cohort", UNKNOWN) if labelled else UNKNOWN,
                account_plain=wire.account, attempt=attempt,
            )  # fmt: skip
            rows.append((attempt.occurred_ms, number, truth))
    if bad:
        log.warning("truth_lines_skipped", path=str(path), lines=bad)
    # Event time, then event id: the order every stage of the stream applies events in
    # (``pipeline.core.engine.replay_order``), so a replay reproduces the live outputs.
    rows.sort(key=lambda r: (r[0], r[2].event_id, r[1]))
    return [reindex(truth, i) for i, (_, _, truth) in enumerate(rows)]


def reindex(truth: TruthEvent, index: int) -> TruthEvent:
    return TruthEvent(index, truth.event_id, truth.scenario, truth.role, truth.actor,
                      truth.cohort, truth.account_plain, truth.attempt)  # fmt: skip


def run_engine(events: Sequence[TruthEvent], policy: Policy) -> Outputs:
    """The core's outputs for the events (in ``load_truth``'s order: event time, then
    event id), with each record's exact position; ``Engine.finish`` at the end, as the
    stream does once its input is idle. ``backtest`` and ``scorecard --engine`` both
    call this, so they give the same answer."""
    engine = Engine(policy)
    out = engine.out
    outputs = Outputs(origin=f"engine:{policy.policy_version}", verdicts=[])
    assert outputs.verdicts is not None
    now = 0
    for position, event in enumerate(events, start=1):
        attempt = event.attempt
        now = max(now, attempt.occurred_ms)
        outputs.verdicts.append(engine.step(attempt, now))
        if out.decisions:
            outputs.decisions.extend(DecisionRecord(k, d, position) for k, d in out.decisions)
            out.decisions.clear()
        if out.alerts:
            outputs.alerts.extend(AlertRecord(a, position) for a in out.alerts)
            out.alerts.clear()
    engine.finish()
    outputs.decisions.extend(DecisionRecord(k, d, len(events)) for k, d in out.decisions)
    outputs.alerts.extend(AlertRecord(a, len(events)) for a in out.alerts)
    out.decisions.clear()
    out.alerts.clear()
    return outputs


def parse_decision(raw: bytes | None) -> Decision | None:
    return None if raw is None else Decision.model_validate_json(raw)


def parse_alert(raw: bytes) -> Alert:
    return Alert.model_validate_json(raw)


def load_outputs(decisions_path: Path, alerts_path: Path | None) -> Outputs:
    """Decision records (``{"key", "value", "after"?}`` per line) and alerts (an alert
    object, or ``{"value": alert, "after"}``, per line) from files."""
    outputs = Outputs(origin=f"file:{decisions_path}")
    for row in _jsonl(decisions_path):
        value = row.get("value")
        decision = None if value is None else Decision.model_validate_json(orjson.dumps(value))
        outputs.decisions.append(DecisionRecord(str(row["key"]), decision, row.get("after")))
    if alerts_path is not None:
        for row in _jsonl(alerts_path):
            body = row.get("value", row)
            alert = Alert.model_validate_json(orjson.dumps(body))
            outputs.alerts.append(AlertRecord(alert, row.get("after")))
    return outputs


def _jsonl(path: Path) -> Iterable[dict[str, Any]]:
    if not path.is_file():
        raise ScorecardError(f"{path} does not exist")
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                try:
                    yield orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ScorecardError(f"{path}:{number} is not JSON ({exc})") from None


def write_outputs(outputs: Outputs, decisions_path: Path, alerts_path: Path) -> None:
    """The inverse of ``load_outputs``."""
    with decisions_path.open("wb") as handle:
        for rec in outputs.decisions:
            value = None if rec.decision is None else rec.decision.model_dump(mode="json")
            handle.write(orjson.dumps({"key": rec.key, "value": value, "after": rec.after}) + b"\n")
    with alerts_path.open("wb") as handle:
        for alert_rec in outputs.alerts:
            row = {"value": alert_rec.alert.model_dump(mode="json"), "after": alert_rec.after}
            handle.write(orjson.dumps(row) + b"\n")


@dataclass
class TopicRead:
    """Records of a topic in partition order, offset order within a partition, and how many
    offsets between the log start and the end had no record (removed by compaction)."""

    records: list[tuple[bytes | None, bytes | None]]
    gaps: int


async def assign_whole_topic(
    consumer: Any, topic: str, bootstrap: str, error: type[AuthpipeError]
) -> list[Any]:
    """Assign every partition of ``topic`` to a started group-less ``consumer``, in
    partition order; raises ``error`` if the topic does not exist."""
    from aiokafka import TopicPartition

    partitions = sorted(consumer.partitions_for_topic(topic) or set())
    if not partitions:
        await consumer._client.force_metadata_update()  # the topic may be brand new
        partitions = sorted(consumer.partitions_for_topic(topic) or set())
    if not partitions:
        raise error(f"topic {topic} does not exist at {bootstrap}; check the name and the bootstrap servers")
    tps = [TopicPartition(topic, p) for p in partitions]
    consumer.assign(tps)
    return tps


async def read_topic(
    bootstrap: str, topic: str, timeout_s: float, security: dict[str, Any] | None = None
) -> TopicRead:
    """Every record of ``topic`` up to its end offsets at the call; no consumer group, no
    commits. ``security``: ``pipeline.kafka_client.security_kwargs``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, **(security or {})
    )
    await consumer.start()
    try:
        tps = await assign_whole_topic(consumer, topic, bootstrap, ScorecardError)
        partitions = [tp.partition for tp in tps]
        await consumer.seek_to_beginning(*tps)
        firsts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        records: dict[int, list[tuple[bytes | None, bytes | None]]] = {p: [] for p in partitions}
        async with asyncio.timeout(timeout_s):
            while True:
                behind = [tp for tp in tps if await consumer.position(tp) < ends[tp]]
                if not behind:
                    break
                batch = await consumer.getmany(*behind, timeout_ms=500)
                for tp, messages in batch.items():
                    records[tp.partition].extend(
                        (m.key, m.value) for m in messages if m.offset < ends[tp]
                    )
        gaps = sum(ends[tp] - firsts[tp] - len(records[tp.partition]) for tp in tps)
        return TopicRead([record for p in partitions for record in records[p]], gaps)
    except TimeoutError:
        raise ScorecardError(
            f"could not read {topic} to its end within {timeout_s:.0f} s"
        ) from None
    finally:
        await consumer.stop()


async def read_outputs_from_topics(
    bootstrap: str, decisions_topic: str, alerts_topic: str, timeout_s: float = 60.0,
    security: dict[str, Any] | None = None,
) -> Outputs:  # fmt: skip
    """The decision topic from the beginning (tombstones included) and the alerts topic."""
    outputs = Outputs(origin=f"topics:{decisions_topic},{alerts_topic}")
    decisions = await read_topic(bootstrap, decisions_topic, timeout_s, security)
    for key, value in decisions.records:
        if key is None:
            continue
        outputs.decisions.append(DecisionRecord(key.decode(), parse_decision(value)))
    outputs.missing_decision_records = decisions.gaps
    for _, value in (await read_topic(bootstrap, alerts_topic, timeout_s, security)).records:
        if value is not None:
            outputs.alerts.append(AlertRecord(parse_alert(value)))
    if decisions.gaps:
        log.warning("decision_records_compacted", topic=decisions_topic, missing=decisions.gaps)
    return outputs


# -- replay -------------------------------------------------------------------------------


def lifted_keys(a: Attempt) -> tuple[Key, ...]:
    """The decision keys a success clears early (the core's success semantics)."""
    if not a.success:
        return ()
    if a.password_flow:
        pair = decision_key("account_source", a.tenant, a.account, a.source, None)
        lock = lock_key(a.tenant, a.account)
        if a.trusted and a.device:
            # The lock is lifted by a trusted success only under the lifetime bound
            # (``replay`` checks the rule of the decision in force).
            return (pair, decision_key("device", a.tenant, a.account, None, a.device), lock)
        return (pair, lock)
    return keys_for(a)[1:]


@dataclass(frozen=True, slots=True)
class _Op:
    at: int  # applied before the event with this index
    seq: int
    kind: str  # put | lift
    key: Key
    active: Active | None = None
    pending_lift: bool = False


def _ops(events: Sequence[TruthEvent], records: Sequence[DecisionRecord]) -> list[_Op]:
    times = [e.occurred_ms for e in events]
    per_key: dict[str, list[tuple[int, DecisionRecord]]] = defaultdict(list)
    for seq, rec in enumerate(records):
        per_key[rec.key].append((seq, rec))
    ops: list[_Op] = []
    for wire_key, recs in per_key.items():
        key = parse_key(wire_key)
        for i, (seq, rec) in enumerate(recs):
            follower = recs[i + 1][1] if i + 1 < len(recs) else None
            if rec.decision is None:
                if rec.after is not None:
                    ops.append(_Op(rec.after, seq, "lift", key))
                continue
            d = rec.decision
            issued = datetime_to_ms(d.issued_at)
            at = rec.after if rec.after is not None else bisect.bisect_right(times, issued)
            active = Active(d.decision_id, d.action, datetime_to_ms(d.expires_at), d.rule)
            pending = follower is not None and follower.decision is None and follower.after is None
            ops.append(_Op(at, seq, "put", key, active, pending))
    ops.sort(key=lambda op: (op.at, op.seq))
    return ops


def replay(events: Sequence[TruthEvent], records: Sequence[DecisionRecord]) -> list[Verdict]:
    """Each event's verdict under the decision stream, as a gateway would have given it."""
    index = DecisionIndex()
    pending: dict[Key, str] = {}
    ops = _ops(events, records)
    verdicts: list[Verdict] = []
    cursor = 0
    for i, event in enumerate(events):
        while cursor < len(ops) and ops[cursor].at <= i:
            op = ops[cursor]
            cursor += 1
            if op.kind == "lift":
                index.lift(op.key)
                continue
            assert op.active is not None
            index.put(op.key, op.active)
            if op.pending_lift:
                pending[op.key] = op.active.decision_id
            else:
                pending.pop(op.key, None)
        a = event.attempt
        verdicts.append(index.check(keys_for(a), a.occurred_ms))
        if a.success and pending:
            for key in lifted_keys(a):
                current = index.get(key)
                if key[0] == "lock" and a.trusted and current is not None and current.rule != "lifetime_bound":
                    continue
                if current is not None and pending.get(key) == current.decision_id:
                    index.lift(key)
                    del pending[key]
    return verdicts


# -- scoring ------------------------------------------------------------------------------


STOPPED, SLOWED, DETECTED_ONLY, MISSED = "stopped", "slowed", "detected_only", "missed"
STATUSES = (STOPPED, SLOWED, DETECTED_ONLY, MISSED)
# "stopped" allows at most this share of the attempts after the first response through.
STOPPED_LEAK_PERCENT = 10


@dataclass
class AttackScore:
    attack: str
    tenant: str
    attempts: int
    start_ms: int
    end_ms: int
    first_block_ms: int | None = None
    first_block_rule: str | None = None
    first_alert_ms: int | None = None
    first_alert_type: str | None = None
    allowed_before_response: int = 0
    refused: int = 0
    allowed: int = 0
    successes_allowed: int = 0
    alerts: Counter[str] = field(default_factory=Counter)
    blocks: Counter[str] = field(default_factory=Counter)
    observes: Counter[str] = field(default_factory=Counter)
    guesses_per_account_24h: int = 0
    account_takeovers: int = 0

    @property
    def response_ms(self) -> int | None:
        times = [t for t in (self.first_block_ms, self.first_alert_ms) if t is not None]
        return min(times) if times else None

    @property
    def response_by(self) -> str | None:
        response = self.response_ms
        if response is None:
            return None
        if response == self.first_block_ms:
            return f"block:{self.first_block_rule}"
        return f"alert:{self.first_alert_type}"

    @property
    def allowed_after_response(self) -> int:
        return self.allowed - self.allowed_before_response

    @property
    def status(self) -> str:
        if self.refused:
            after = self.allowed_after_response
            leaked = after * 100 > STOPPED_LEAK_PERCENT * (after + self.refused)
            return SLOWED if self.successes_allowed or leaked else STOPPED
        if self.response_ms is not None or self.observes:
            return DETECTED_ONLY
        return MISSED

    def as_json(self) -> dict[str, Any]:
        response = self.response_ms
        return {
            "attack": self.attack,
            "tenant": self.tenant,
            "status": self.status,
            "attempts": self.attempts,
            "start": ts(self.start_ms),
            "end": ts(self.end_ms),
            "first_block": ts(self.first_block_ms),
            "first_block_rule": self.first_block_rule,
            "first_alert": ts(self.first_alert_ms),
            "first_alert_type": self.first_alert_type,
            "response": ts(response),
            "response_by": self.response_by,
            "time_to_response_ms": None if response is None else response - self.start_ms,
            "allowed_before_response": self.allowed_before_response,
            "refused": self.refused,
            "allowed": self.allowed,
            "successes_allowed": self.successes_allowed,
            "guesses_per_account_24h": self.guesses_per_account_24h,
            "account_takeovers": self.account_takeovers,
            "alerts": dict(sorted(self.alerts.items())),
            "blocks": dict(sorted(self.blocks.items())),
            "observes": dict(sorted(self.observes.items())),
        }


def ts(ms: int | None) -> str | None:
    return None if ms is None else format_utc_ms(ms_to_datetime(ms))


@dataclass
class Scorecard:
    origin: str
    policy_version: str | None
    events: int
    attacks: list[AttackScore]
    legit_attempts: Counter[str]
    legit_refused: Counter[str]
    legit_examples: list[dict[str, Any]]
    alerts_by_type: Counter[str]
    unmatched_alerts: list[dict[str, Any]]
    blocks: int
    observes: int
    tombstones: int
    unmatched_blocks: list[dict[str, Any]]
    missing_decision_records: int = 0
    seed_holds_matching_no_attack: int = 0
    legit_by_design: Counter[str] = field(default_factory=Counter)
    legit_by_design_why: dict[str, list[str]] = field(default_factory=dict)

    @property
    def all_caught(self) -> bool:
        """No attack missed (each was at least detected); says nothing about stopping it."""
        return all(a.status != MISSED for a in self.attacks)

    @property
    def takeovers(self) -> int:
        return sum(a.successes_allowed for a in self.attacks)

    def closing_line(self) -> str:
        """One honest sentence: how many attacks were stopped, slowed, only detected, missed."""
        counts = Counter(a.status for a in self.attacks)
        total = len(self.attacks)
        allowed = sum(a.allowed for a in self.attacks)
        if counts[STOPPED] == total and not self.takeovers:
            head = f"{total} of {total} attacks stopped, no account taken over"
        else:
            parts = [f"{counts[s]} {s.replace('_', ' ')}" for s in STATUSES if counts[s]]
            head = f"{counts[STOPPED]} of {total} attacks stopped ({', '.join(parts)})"
            if self.takeovers:
                by = ", ".join(f"{a.attack} {a.successes_allowed}" for a in self.attacks
                               if a.successes_allowed)  # fmt: skip
                head += f"; {self.takeovers} ACCOUNT TAKEOVERS ({by})"
        return (f"{head}; {allowed:,} attacker attempts allowed; "
                f"{self.legit_refused_total} legitimate attempts refused")  # fmt: skip

    @property
    def legit_refused_total(self) -> int:
        return sum(self.legit_refused.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "policy_version": self.policy_version,
            "events": self.events,
            "all_attacks_caught": self.all_caught,
            "status_counts": {s: sum(a.status == s for a in self.attacks) for s in STATUSES},
            "account_takeovers": self.takeovers,
            "summary": self.closing_line(),
            "attacks": [a.as_json() for a in self.attacks],
            "legitimate": {
                "attempts": sum(self.legit_attempts.values()),
                "refused": self.legit_refused_total,
                "refused_by_design": {
                    cohort: {"refused": n, "why": self.legit_by_design_why.get(cohort, [])}
                    for cohort, n in sorted(self.legit_by_design.items())
                },
                "by_cohort": {
                    cohort: {"attempts": n, "refused": self.legit_refused.get(cohort, 0)}
                    for cohort, n in sorted(self.legit_attempts.items())
                },
                "examples": self.legit_examples,
            },
            "decisions": {
                "blocks": self.blocks,
                "observes": self.observes,
                "tombstones": self.tombstones,
                "records_compacted_away": self.missing_decision_records,
            },
            "blocks_matching_no_attack": self.unmatched_blocks,
            "seed_holds_matching_no_attack": self.seed_holds_matching_no_attack,
            "alerts": {
                "total": sum(self.alerts_by_type.values()),
                "by_type": dict(sorted(self.alerts_by_type.items())),
            },
            "alerts_matching_no_attack": self.unmatched_alerts,
        }


@dataclass
class _AttackIndex:
    """Per attack: its events, its keys, its sources and accounts."""

    events: dict[str, list[TruthEvent]] = field(default_factory=lambda: defaultdict(list))
    keys: dict[Key, set[str]] = field(default_factory=lambda: defaultdict(set))
    sources: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    accounts: dict[tuple[str, str], set[str]] = field(default_factory=lambda: defaultdict(set))

    @classmethod
    def build(cls, events: Sequence[TruthEvent]) -> _AttackIndex:
        idx = cls()
        for e in events:
            if e.role != ATTACKER:
                continue
            a = e.attempt
            idx.events[e.scenario].append(e)
            for key in keys_for(a):
                idx.keys[key].add(e.scenario)
            idx.sources[(a.tenant, a.source)].add(e.scenario)
            idx.accounts[(a.tenant, a.account)].add(e.scenario)
        return idx


def score(events: Sequence[TruthEvent], outputs: Outputs) -> Scorecard:
    """The scorecard of ``outputs`` against the labelled ``events``."""
    verdicts = replay(events, outputs.decisions)
    design = design_reasons(events, verdicts)
    attacks = _AttackIndex.build(events)
    scores = {name: _new_score(name, evs) for name, evs in sorted(attacks.events.items())}
    decision_stats = _score_decisions(outputs.decisions, attacks, scores, events, verdicts, design)
    alerts_by_type, unmatched_alerts = _score_alerts(outputs.alerts, events, attacks, scores)
    legit_attempts: Counter[str] = Counter()
    legit_refused: Counter[str] = Counter()
    by_design: Counter[str] = Counter()
    why: dict[str, list[str]] = defaultdict(list)
    examples: list[dict[str, Any]] = []
    let_through: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    taken: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for event, verdict, reason in zip(events, verdicts, design, strict=True):
        if event.role == ATTACKER:
            _count_attacker(scores[event.scenario], event, verdict)
            a = event.attempt
            if verdict.allowed and a.success:
                taken[event.scenario].add((a.tenant, a.account))
            elif verdict.allowed:
                let_through[(event.scenario, a.tenant, a.account)].append(event.occurred_ms)
        elif event.role in LEGIT_ROLES:
            legit_attempts[event.cohort] += 1
            if not verdict.allowed:
                if reason is not None:
                    by_design[event.cohort] += 1
                    if reason not in why[event.cohort]:
                        why[event.cohort].append(reason)
                    continue
                legit_refused[event.cohort] += 1
                if len(examples) < EXAMPLES:
                    examples.append(_example(event, verdict))
    for (name, _, _), times in let_through.items():
        s = scores[name]
        s.guesses_per_account_24h = max(s.guesses_per_account_24h, most_in_a_day(times))
    for name, accounts in taken.items():
        scores[name].account_takeovers = len(accounts)
    versions = {r.decision.policy_version for r in outputs.decisions if r.decision is not None}
    versions |= {r.alert.policy_version for r in outputs.alerts}
    return Scorecard(
        origin=outputs.origin,
        policy_version=",".join(sorted(versions)) or None,
        events=len(events),
        attacks=list(scores.values()),
        legit_attempts=legit_attempts,
        legit_refused=legit_refused,
        legit_examples=examples,
        legit_by_design=by_design,
        legit_by_design_why=dict(why),
        alerts_by_type=alerts_by_type,
        unmatched_alerts=unmatched_alerts,
        missing_decision_records=outputs.missing_decision_records,
        **decision_stats,
    )


def most_in_a_day(times: Sequence[int]) -> int:
    """The most of ``times`` (sorted epoch ms) inside any 24 h."""
    most = first = 0
    for last, t in enumerate(times):
        while t - times[first] >= DAY_MS:
            first += 1
        most = max(most, last - first + 1)
    return most


def design_reasons(events: Sequence[TruthEvent], verdicts: Sequence[Verdict]) -> list[str | None]:
    """Per event: why a seed's rule refused this legitimate attempt on purpose, else None.

    ``BY_DESIGN`` names the cohorts a rule refuses on purpose; a lock refusal of any other
    legitimate attempt is by design when attacker failures on the account are in its run
    (since its last untrusted success; the simulator enforces nothing, so the worker counted
    them whether or not a gateway would have refused them), ``ATTACKED_RUN``, or failures of the
    account's own stale app, ``STALE_APP_RUN``."""
    fed: dict[tuple[str, str], str] = {}
    reasons: list[str | None] = []
    for event, verdict in zip(events, verdicts, strict=True):
        a = event.attempt
        account = (a.tenant, a.account)
        key = verdict.matched_key
        reason = None
        if event.role in LEGIT_ROLES and not verdict.allowed and key is not None:
            reason = BY_DESIGN.get((event.cohort, key[0]))
            if reason is None and key[0] == "lock":
                reason = fed.get(account)
        reasons.append(reason)
        counted = verdict.allowed and a.password_flow and not a.trusted
        # The simulated login service enforces nothing, so the worker counted an attacker's
        # failure into the run even where a gateway would have refused it.
        if a.password_flow and not a.trusted and not a.success and event.role == ATTACKER:
            fed[account] = ATTACKED_RUN
        elif counted and not a.success and event.cohort == "stale_app":
            fed.setdefault(account, STALE_APP_RUN)
        elif counted and a.success:
            fed.pop(account, None)
    return reasons


def _new_score(name: str, evs: list[TruthEvent]) -> AttackScore:
    return AttackScore(
        attack=name, tenant=evs[0].attempt.tenant, attempts=len(evs),
        start_ms=evs[0].occurred_ms, end_ms=evs[-1].occurred_ms,
    )  # fmt: skip


def _count_attacker(s: AttackScore, event: TruthEvent, verdict: Verdict) -> None:
    if not verdict.allowed:
        s.refused += 1
        return
    s.allowed += 1
    if event.attempt.success:
        s.successes_allowed += 1
    response = s.response_ms
    if response is None or event.occurred_ms <= response:
        s.allowed_before_response += 1


def _example(event: TruthEvent, verdict: Verdict) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        "at": ts(event.occurred_ms),
        "cohort": event.cohort,
        "actor": event.actor,
        "flow": event.attempt.flow,
        "refused_by": "|".join(p or "-" for p in verdict.matched_key)
        if verdict.matched_key
        else None,
        "retry_after_ms": verdict.retry_after_ms,
    }


def _score_decisions(
    records: Sequence[DecisionRecord], attacks: _AttackIndex, scores: dict[str, AttackScore],
    events: Sequence[TruthEvent], verdicts: Sequence[Verdict], design: Sequence[str | None],
) -> dict[str, Any]:  # fmt: skip
    blocks = observes = tombstones = 0
    unmatched: list[dict[str, Any]] = []
    refused_by: Counter[Key] = Counter()
    seed_holds = 0
    for event, verdict, reason in zip(events, verdicts, design, strict=True):
        key = verdict.matched_key
        if key is not None and event.role != ATTACKER and reason is None:
            refused_by[key] += 1
    for rec in records:
        d = rec.decision
        if d is None:
            tombstones += 1
            continue
        key = parse_key(rec.key)
        issued = datetime_to_ms(d.issued_at)
        matched = [
            scores[name] for name in sorted(attacks.keys.get(key, ()))
            if scores[name].start_ms <= issued <= scores[name].end_ms
        ]  # fmt: skip
        if d.action == "block":
            blocks += 1
            for s in matched:
                s.blocks[d.rule] += 1
                if s.first_block_ms is None or issued < s.first_block_ms:
                    s.first_block_ms, s.first_block_rule = issued, d.rule
            if not matched and d.rule in SEED_RULES and not refused_by.get(key, 0):
                seed_holds += 1
            elif not matched:
                unmatched.append({"key": rec.key, "rule": d.rule, "issued_at": ts(issued),
                                  "refused_legitimate": refused_by.get(key, 0)})  # fmt: skip
        else:
            observes += 1
            for s in matched:
                s.observes[d.rule] += 1
    return {
        "blocks": blocks,
        "observes": observes,
        "tombstones": tombstones,
        "unmatched_blocks": unmatched,
        "seed_holds_matching_no_attack": seed_holds,
    }


def match_alerts(
    records: Sequence[AlertRecord], events: Sequence[TruthEvent]
) -> list[tuple[int, list[str], str | None]]:
    """Per alert: its event time, the attacks it matches, and a note when it matches none."""
    attacks = _AttackIndex.build(events)
    scores = {name: _new_score(name, evs) for name, evs in attacks.events.items()}
    windows = _TenantWindows(events)
    return [_match_alert(rec, events, attacks, scores, windows) for rec in records]


def _score_alerts(
    records: Sequence[AlertRecord], events: Sequence[TruthEvent], attacks: _AttackIndex,
    scores: dict[str, AttackScore],
) -> tuple[Counter[str], list[dict[str, Any]]]:  # fmt: skip
    by_type: Counter[str] = Counter()
    unmatched: list[dict[str, Any]] = []
    tenant_windows = _TenantWindows(events)
    for rec in records:
        alert = rec.alert
        by_type[alert.type] += 1
        at_ms, names, note = _match_alert(rec, events, attacks, scores, tenant_windows)
        for name in names:
            s = scores[name]
            s.alerts[alert.type] += 1
            if s.first_alert_ms is None or at_ms < s.first_alert_ms:
                s.first_alert_ms, s.first_alert_type = at_ms, alert.type
        if not names:
            unmatched.append({
                "type": alert.type, "tenant": alert.tenant, "source": alert.source,
                "account_digest": alert.account_digest, "count": alert.count, "at": ts(at_ms),
                "note": note,
            })  # fmt: skip
    return by_type, unmatched


def _match_alert(
    rec: AlertRecord, events: Sequence[TruthEvent], attacks: _AttackIndex,
    scores: dict[str, AttackScore], tenant_windows: _TenantWindows,
) -> tuple[int, list[str], str | None]:  # fmt: skip
    """(time of the alert, attacks it matches, a note when it matches none)."""
    alert = rec.alert
    start_ms, end_ms = datetime_to_ms(alert.window_start), datetime_to_ms(alert.window_end)
    known_ms = events[rec.after - 1].occurred_ms if rec.after else None
    if alert.type in TENANT_ALERTS:
        at_ms, shares = tenant_windows.contributions(
            alert.tenant, start_ms, end_ms, alert.count, unknown_only=alert.type == "stuffing_tenant"
        )
        # Both are evaluated at second boundaries of event time: each fired at the first
        # one after its window's ``count``-th account failed, however the outputs were read.
        at_ms = at_ms - at_ms % TICK_MS + TICK_MS
        attacker_share = sum(v for k, v in shares.items() if k is not None)
        if attacker_share < MIN_ATTACKER_SHARE:
            return (
                at_ms,
                [],
                f"{round(100 * (1 - attacker_share))} % of its accounts were ordinary failures",
            )
        names = sorted(k for k, v in shares.items() if k is not None and v >= MIN_ATTACK_SHARE)
        return at_ms, names, None
    at_ms = known_ms if known_ms is not None else end_ms
    candidates: set[str] = set()
    if alert.source is not None:
        candidates |= attacks.sources.get((alert.tenant, alert.source), set())
    if alert.account_digest is not None:
        candidates |= attacks.accounts.get((alert.tenant, alert.account_digest), set())
    slack = end_ms - start_ms
    names = sorted(n for n in candidates if scores[n].start_ms <= at_ms <= scores[n].end_ms + slack)
    return at_ms, names, None if names else "its subject is not part of any attack at that time"


class _TenantWindows:
    """Distinct accounts with untrusted password failures per tenant, in event order, with
    the attack (or None) whose failure first counted each: what rule 8 sums (and, with
    ``unknown_only``, the ``unknown_account`` ones ``stuffing_tenant`` sums)."""

    def __init__(self, events: Sequence[TruthEvent]) -> None:
        self.events = events
        self._cache: dict[tuple[str, int, int, bool], list[tuple[int, str | None]]] = {}

    def _accounts(
        self, tenant: str, start_ms: int, end_ms: int, unknown_only: bool
    ) -> list[tuple[int, str | None]]:
        slot = (tenant, start_ms, end_ms, unknown_only)
        cached = self._cache.get(slot)
        if cached is not None:
            return cached
        seen: set[str] = set()
        out: list[tuple[int, str | None]] = []
        lo = bisect.bisect_left(self.events, start_ms, key=lambda e: e.occurred_ms)
        for e in self.events[lo:]:
            a = e.attempt
            if a.occurred_ms >= end_ms:
                break
            if a.tenant != tenant or not a.untrusted_password_failure or a.account in seen:
                continue
            if unknown_only and a.failure_reason != "unknown_account":
                continue
            seen.add(a.account)
            out.append((a.occurred_ms, e.scenario if e.role == ATTACKER else None))
        self._cache[slot] = out
        return out

    def contributions(
        self, tenant: str, start_ms: int, end_ms: int, count: int, *, unknown_only: bool = False
    ) -> tuple[int, dict[str | None, float]]:
        """When the window's ``count``-th account failed, and who gave the first ``count``."""
        accounts = self._accounts(tenant, start_ms, end_ms, unknown_only)[: max(count, 1)]
        if not accounts:
            return end_ms, {}
        tally = Counter(name for _, name in accounts)
        return accounts[-1][0], {name: n / len(accounts) for name, n in tally.items()}


# -- rendering ----------------------------------------------------------------------------


def _duration(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def render(card: Scorecard) -> str:
    """The scorecard as a plain-text table."""
    head = (f"{'attack':<32} {'tenant':<8} {'attempts':>8} {'responded':>9}  {'by':<26}"
            f"{'through':>7} {'refused':>8} {'allowed':>8} {'g/acct/24h':>10} {'ATO':>4}  status")  # fmt: skip
    lines = [
        f"scorecard: {card.origin}, policy {card.policy_version or '-'}, {card.events:,} events",
        head,
    ]
    for a in card.attacks:
        response = a.response_ms
        took = None if response is None else response - a.start_ms
        lines.append(
            f"{a.attack:<32} {a.tenant:<8} {a.attempts:>8} {_duration(took):>9}  "
            f"{a.response_by or '-':<26}{a.allowed_before_response:>7} {a.refused:>8} "
            f"{a.allowed:>8} {a.guesses_per_account_24h:>10} {a.successes_allowed:>4}  {a.status.replace('_', ' ')}"
            + ("  <- ACCOUNTS TAKEN OVER" if a.successes_allowed else "")
        )
    cohorts = ", ".join(
        f"{c} {card.legit_refused.get(c, 0)}/{n}" for c, n in sorted(card.legit_attempts.items())
    )
    lines.append(f"legitimate attempts refused: {card.legit_refused_total} ({cohorts})")
    for cohort, n in sorted(card.legit_by_design.items()):
        lines.append(f"  refused by design: {cohort} {n}: {'; '.join(card.legit_by_design_why.get(cohort, []))}")
    for ex in card.legit_examples:
        lines.append(
            f"  {ex['at']} {ex['cohort']} {ex['actor']} {ex['flow']} refused by {ex['refused_by']}"
        )
    lines.append(
        f"decisions: {card.blocks} blocks, {card.observes} observe, {card.tombstones} tombstones; "
        f"blocks matching no attack: {len(card.unmatched_blocks)} "
        f"(and {card.seed_holds_matching_no_attack} seed holds that refused nobody wrongly)"
    )
    types = ", ".join(f"{t} {n}" for t, n in sorted(card.alerts_by_type.items()))
    lines.append(f"alerts: {sum(card.alerts_by_type.values())} ({types or 'none'}); "
                 f"matching no attack: {len(card.unmatched_alerts)}")  # fmt: skip
    for un in card.unmatched_alerts:
        subject = un["source"] or un["account_digest"] or un["tenant"]
        lines.append(f"  {un['type']} {subject} at {un['at']} ({un['count']}): {un['note']}")
    lines.append(
        "responded: time from the attack's first attempt to its first block or alert; "
        "through: its attempts allowed until then; g/acct/24h: the most guesses let through "
        "against one account in any 24 h; ATO: its successes allowed (account "
        "takeovers); status: stopped (refused, no takeover, <= 10 % through after the response), "
        "slowed (refused, but more through or a takeover), detected only (nothing refused), missed"
    )
    if card.missing_decision_records:
        lines.append(
            f"WARNING: {card.missing_decision_records} records of the decision topic were compacted "
            "away before this read: decisions superseded or lifted by then are missing, so "
            "refusals and first blocks are under-counted (score a fresher read, or files)"
        )
    lines.append(card.closing_line())
    return "\n".join(lines)


def write_json(card: Scorecard, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(card.as_json(), option=orjson.OPT_INDENT_2))


def run_scorecard_command(
    settings: Settings, *, truth: Path, from_topics: bool, decisions: Path | None,
    alerts: Path | None, engine: bool, policy: Path | None, out: Path | None,
    save_outputs: Path | None, timeout_s: float, strict: bool,
) -> int:  # fmt: skip
    """``authpipe scorecard``: load, score, print, write; exit 3 on failure with --strict."""
    events = load_truth(truth, build_normaliser(settings))
    if engine:
        outputs = run_engine(events, load_policy(policy or settings.policy_path))
    elif decisions is not None:
        outputs = load_outputs(decisions, alerts)
    else:
        from pipeline.kafka_client import security_kwargs

        kafka = settings.kafka
        outputs = asyncio.run(read_outputs_from_topics(
            kafka.bootstrap_servers, kafka.decisions_topic, kafka.alerts_topic, timeout_s,
            security_kwargs(kafka),
        ))  # fmt: skip
    card = score(events, outputs)
    print(render(card))
    if out is not None:
        write_json(card, out)
        print(f"scorecard JSON: {out}")
    if save_outputs is not None:
        save_outputs.mkdir(parents=True, exist_ok=True)
        write_outputs(outputs, save_outputs / "decisions.jsonl", save_outputs / "alerts.jsonl")
        print(f"decisions and alerts: {save_outputs}/decisions.jsonl, {save_outputs}/alerts.jsonl")
    log.info("scorecard_finished", events=card.events, attacks=len(card.attacks),
             statuses=",".join(a.status for a in card.attacks), takeovers=card.takeovers,
             legit_refused=card.legit_refused_total)  # fmt: skip
    if strict and (not card.all_caught or card.legit_refused_total):
        return 3
    return 0
