"""The gateway's decision view: the compacted decisions topic in memory, and the check.

``DecisionView`` holds the active decisions in the core's ``DecisionIndex`` and answers
``check`` with the core's own ``applicable_keys`` and ``DecisionIndex.check``, after the
same normalisation as the worker (``Normaliser``: trusted proxies, prefixes, keyed
digest, case rules). It does no I/O: a check is a few dict lookups.

* Normalised accounts, sources, devices and sessions, and the applicable keys of a
  check's arguments, are kept in bounded caches (oldest entry dropped first): a cache
  maps an input to its deterministic result, so it never changes an answer.
* The core's index counts active decisions per subject (account digest, or source for
  source-scope keys): an attempt whose account digest and source are no subject cannot
  be refused (``DecisionIndex.may_apply``), the common case, answered with two lookups;
  every other attempt goes to the core's ``DecisionIndex.check``.

``DecisionFeed`` follows the topic into a view without a consumer group: it assigns
every partition, seeks to the beginning and then follows. Messages are applied as they
come: a decision replaces its key, a tombstone lifts it, and a decision whose
``expires_at`` has passed is dropped at once (and an active one stops counting at its
``expires_at`` even if no tombstone ever arrives: a gateway offline for longer than
the topic's ``delete.retention.ms`` misses tombstones, never expiries). A message that
is not a valid decision is logged and counted, and changes nothing: the key keeps its
last good decision until a tombstone or its expiry (a malformed value must not lift a
block; a restarted edge that finds only the malformed value after compaction has no
decision for that key). The feed is ready once it has read up to the end offsets it saw at
start; it exposes lag (messages not yet read) and staleness (time since the broker last
answered a fetch of every partition).

The clock is injected (``now_ms``), so tests control expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, get_args

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition

from pipeline.contracts.models import TENANT_RULE, Flow, Scope, datetime_to_ms, valid_tenant
from pipeline.core.decisions import ALLOWED, Active, DecisionIndex, Verdict, applicable_keys
from pipeline.core.errors import InvalidAttempt
from pipeline.core.keys import Key, format_key, parse_key
from pipeline.edge.blocklist import BlockEntry, valid_source
from pipeline.errors import AuthpipeError
from pipeline.logs import get_logger
from pipeline.wiring import build_normaliser

if TYPE_CHECKING:
    from pipeline.core.attempt import Normaliser
    from pipeline.settings import Settings

log = get_logger("edge")

FLOWS = frozenset(get_args(Flow))
SCOPES = frozenset(get_args(Scope))
ACTIONS = frozenset({"block", "observe"})
TENANT_MAX_CHARS = 64
ACCOUNT_MAX_CHARS = 320
HANDLE_MAX_CHARS = 256
FORWARDED_MAX_HOPS = 64
FORWARDED_MAX_CHARS = 2048
FORWARDED_MAX_HOP_CHARS = 64
FORWARDED_CACHED_MAX_CHARS = 256
"""Checks whose ``forwarded_for`` is longer are answered without caching (a proxy chain
is a few hops of 7 to 45 characters; longer text is a client's to vary at will)."""
IP_MAX_CHARS = 64
CACHE_ENTRIES = 65_536
APPLY_CHUNK = 32
"""Messages applied between two looks at the clock (about 0.5 ms of work here)."""
APPLY_BUDGET_S = 0.001
"""The longest the feed applies messages before it yields to the event loop."""
TOPIC_MISSING_LOG_S = 60.0
"""While the decisions topic is missing, the warning is repeated this often."""
OUTCOMES = ("put", "lift", "expired", "bad")


def wall_ms() -> int:
    """Wall-clock epoch milliseconds (UTC); the default clock of a view."""
    return time.time_ns() // 1_000_000


def settle_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach (``gc.freeze``).

    A loaded view is hundreds of thousands of long-lived objects (decisions, keys, cache
    entries); a full collection walks all of them (250-320 ms with 100,000 decisions on a
    2-core machine), a pause every request in flight waits out. Frozen objects are never
    walked again; they are still freed by reference counting when a decision goes (the
    view holds no reference cycles). No collection first: that would be one such pause.
    Called once the feed has caught up.
    """
    gc.freeze()


class EdgeError(AuthpipeError):
    """Base of the edge's errors."""


class CheckInputError(EdgeError):
    """A check argument is malformed; ``parameter`` is its HTTP name (``ip``, ``device``,
    ``session``, ``forwarded_for``, ``account``, ``tenant``, ``trusted``, ``flow``)."""

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.message = message


class BadDecision(EdgeError):
    """A message on the decisions topic that is not a valid decision or tombstone."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class FeedNotReady(EdgeError):
    """The feed did not catch up in time."""


# -- decoding messages ----------------------------------------------------------------


def decode_key(raw: bytes | None, ipv4_prefix: int = 32, ipv6_prefix: int = 64) -> tuple[Key, str]:
    """A Kafka key as a decision key and its text; raises BadDecision("bad_key"/"bad_source").
    A source wider than the grouping (``ipv4_prefix``/``ipv6_prefix``) is a bad source."""
    if not raw:
        raise BadDecision("bad_key", "the message has no key")
    try:
        text = raw.decode("utf-8")
        scope, tenant, account, source, device = parse_key(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadDecision("bad_key", str(exc)[:200]) from None
    if scope not in SCOPES:
        raise BadDecision("bad_key", f"unknown scope {scope[:40]!r}")
    if scope == "source" and not (source and valid_source(source, ipv4_prefix, ipv6_prefix)):
        raise BadDecision(
            "bad_source",
            f"source {str(source)[:64]!r} is not an address or CIDR no wider than one source",
        )
    # Interned key parts: the check's keys and the index's keys then share their strings, so
    # comparing them on lookup is an identity test instead of reading two cold strings.
    intern = sys.intern
    key: Key = (intern(scope), intern(tenant), intern(account) if account else None,
                intern(source) if source else None, intern(device) if device else None)  # fmt: skip
    return key, text


def _text_field(value: dict[str, Any], name: str) -> str:
    text = value.get(name)
    if not isinstance(text, str) or not text:
        raise BadDecision("bad_value", f"field {name!r} is missing or not a non-empty string")
    return text


def _expires_ms(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadDecision("bad_value", f"expires_at {text[:40]!r} is not RFC 3339") from None
    if moment.tzinfo is None:
        raise BadDecision("bad_value", f"expires_at {text[:40]!r} has no UTC offset")
    return datetime_to_ms(moment)


def decode_decision(wire_key: str, raw: bytes) -> Active:
    """A decision value as the index keeps it; raises BadDecision("bad_value"/"not_json").

    Only the fields enforcement needs are checked (extra fields are ignored, so a newer
    worker's decisions still apply); ``key`` must equal the Kafka key.
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadDecision("not_json", "the value is neither JSON nor null") from None
    if not isinstance(value, dict):
        raise BadDecision("not_json", "the value is not a JSON object")
    if value.get("key") != wire_key:
        raise BadDecision("key_mismatch", "the value's key differs from the message key")
    action = value.get("action")
    decision_id = value.get("decision_id")
    expires_at = value.get("expires_at")
    rule = value.get("rule")
    # The common case in one test; any miss re-checks field by field for the message.
    if not (
        action.__class__ is str
        and action in ACTIONS
        and decision_id.__class__ is str
        and decision_id
        and expires_at.__class__ is str
        and expires_at
        and rule.__class__ is str
        and rule
    ):
        action = _text_field(value, "action")
        if action not in ACTIONS:
            raise BadDecision("bad_value", f"action {action[:20]!r} is neither block nor observe")
        decision_id = _text_field(value, "decision_id")
        expires_at = _text_field(value, "expires_at")
        rule = _text_field(value, "rule")
    return Active(decision_id, action, _expires_ms(expires_at), rule)


# -- change signals -------------------------------------------------------------------


class ChangeSignal:
    """A version number whose waiters wake at the next bump (no event until one waits)."""

    __slots__ = ("_event", "version")

    def __init__(self) -> None:
        self.version = 0
        self._event: asyncio.Event | None = None

    def bump(self) -> None:
        self.version += 1
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, version: int, timeout_s: float) -> bool:
        """True once the version differs from ``version``; False after ``timeout_s``."""
        if self.version != version:
            return True
        if self._event is None:
            self._event = asyncio.Event()
        event = self._event
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass
        return self.version != version


@dataclass(slots=True)
class ViewStats:
    """Counts of applied messages by outcome, and of bad ones by reason."""

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    bad_reasons: dict[str, int] = field(default_factory=dict)
    pruned: int = 0


# -- the view ---------------------------------------------------------------------------


_Memo = tuple[tuple[Key, ...], str, str]
"""What a check's arguments come to: the applicable keys, the account digest, the source."""


def _remember(cache: dict[Any, str], key: Any, value: str, capacity: int) -> str:
    if len(cache) >= capacity:
        del cache[next(iter(cache))]
    cache[key] = value
    return value


def _check_tenant(tenant: object) -> None:
    if not valid_tenant(tenant):
        raise CheckInputError("tenant", TENANT_RULE)


def _handle(parameter: str, value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= HANDLE_MAX_CHARS:
        raise CheckInputError(parameter, f"{parameter} must be a string of 1 to 256 characters")
    return value


def _chars(forwarded_for: str | tuple[str, ...]) -> int:
    """The length of ``forwarded_for`` as text (a tuple counted as joined by commas)."""
    if isinstance(forwarded_for, str):
        return len(forwarded_for)
    return sum(map(len, forwarded_for)) + max(0, len(forwarded_for) - 1)


def split_forwarded(forwarded_for: str | Sequence[str]) -> tuple[str, ...]:
    """``forwarded_for`` as hops: a comma-separated header value or a sequence of strings;
    at most ``FORWARDED_MAX_HOPS`` hops of ``FORWARDED_MAX_HOP_CHARS`` characters each and
    ``FORWARDED_MAX_CHARS`` in all (a caller cannot make the edge keep or parse more)."""
    if isinstance(forwarded_for, str):
        total = len(forwarded_for)
        if total <= FORWARDED_MAX_CHARS:
            hops = tuple(hop.strip() for hop in forwarded_for.split(",") if hop.strip())
    else:
        hops = tuple(forwarded_for)
        if not all(isinstance(hop, str) for hop in hops):
            raise CheckInputError("forwarded_for", "forwarded_for entries must be strings")
        total = _chars(hops)
    if total > FORWARDED_MAX_CHARS:
        raise CheckInputError(
            "forwarded_for", f"forwarded_for is longer than {FORWARDED_MAX_CHARS} characters"
        )
    if len(hops) > FORWARDED_MAX_HOPS:
        raise CheckInputError("forwarded_for", "forwarded_for has more than 64 addresses")
    if any(len(hop) > FORWARDED_MAX_HOP_CHARS for hop in hops):
        raise CheckInputError(
            "forwarded_for",
            f"a forwarded_for entry is longer than {FORWARDED_MAX_HOP_CHARS} characters",
        )
    return hops


class DecisionView:
    """Active decisions by key, fed message by message; ``check`` without I/O."""

    def __init__(
        self,
        normaliser: Normaliser,
        *,
        now_ms: Callable[[], int] = wall_ms,
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        self.normaliser = normaliser
        self.now_ms = now_ms
        self.index = DecisionIndex()
        self.stats = ViewStats()
        self.changes = ChangeSignal()
        self.blocklist_changes = ChangeSignal()
        self._sources: dict[Key, Active] = {}
        self.tenants: set[str] = {"default"}
        """Tenants a decision has named (and ``default``): the feed serves these."""
        self._capacity = cache_entries
        self._accounts: dict[tuple[str, str], str] = {}
        self._addresses: dict[tuple[str, tuple[str, ...]], str] = {}
        self._devices: dict[tuple[str, str], str] = {}
        self._sessions: dict[tuple[str, str], str] = {}
        self._keys: dict[tuple[Any, ...], _Memo] = {}
        # Bound once: the check is a few lookups, so two attribute loads per call show.
        self._memo_get = self._keys.get
        self._may_apply = self.index.may_apply

    def __len__(self) -> int:
        return len(self.index)

    # -- applying messages ---------------------------------------------------------------

    def apply(self, key: bytes | None, value: bytes | None) -> str:
        """Apply one message of the topic; returns the outcome (one of ``OUTCOMES``).

        Raises nothing: a bad message is counted by reason and logged; the key keeps its
        last good decision.
        """
        return self._apply(key, value, self.now_ms())

    def apply_batch(self, records: Iterable[Any]) -> int:
        """Apply fetched records (objects with ``key`` and ``value``) in order, as ``apply``
        does one by one, with the clock read once for the batch; returns how many."""
        apply, now = self._apply, self.now_ms()
        applied = 0
        for record in records:
            apply(record.key, record.value, now)
            applied += 1
        return applied

    def _apply(self, key: bytes | None, value: bytes | None, now_ms: int) -> str:
        try:
            rules = self.normaliser.sources
            decision_key, wire_key = decode_key(key, rules.ipv4_prefix, rules.ipv6_prefix)
        except BadDecision as exc:
            return self._bad(exc, None)
        if value is None:
            self._lift(decision_key)
            return self._count("lift")
        try:
            active = decode_decision(wire_key, value)
        except BadDecision as exc:
            return self._bad(exc, decision_key)
        if active.expires_ms <= now_ms:
            self._lift(decision_key)
            return self._count("expired")
        self.index.put(decision_key, active)
        self.tenants.add(decision_key[1])
        if decision_key[0] == "source":
            self._sources[decision_key] = active
            self.blocklist_changes.bump()
        self.changes.bump()
        return self._count("put")

    def _count(self, outcome: str) -> str:
        self.stats.outcomes[outcome] += 1
        return outcome

    def _bad(self, exc: BadDecision, key: Key | None) -> str:
        """Count and log a bad message; the key's last good decision stays (a malformed
        value must never lift a block: only a tombstone or the expiry does)."""
        reasons = self.stats.bad_reasons
        reasons[exc.reason] = reasons.get(exc.reason, 0) + 1
        log.warning(
            "edge_bad_decision",
            reason=exc.reason,
            detail=exc.detail,
            key=None if key is None else format_key(key),
            kept=key is not None and self.index.get(key) is not None,
        )
        return self._count("bad")

    def _lift(self, key: Key) -> None:
        if self.index.lift(key) is None:
            return
        if self._sources.pop(key, None) is not None:
            self.blocklist_changes.bump()
        self.changes.bump()

    def prune(self) -> int:
        """Drop decisions expired now (check already ignores them); returns how many."""
        removed = self.index.prune(self.now_ms())
        if not removed:
            return 0
        sources = [key for key in removed if self._sources.pop(key, None) is not None]
        if sources:
            self.blocklist_changes.bump()
        self.changes.bump()
        self.stats.pruned += len(removed)
        return len(removed)

    # -- the check -----------------------------------------------------------------------

    def check(
        self,
        tenant: str,
        account: str,
        source_ip: str,
        forwarded_for: str | Sequence[str] = (),
        device_id: str | None = None,
        trusted: bool = False,
        flow: str = "login",
        session_id: str | None = None,
    ) -> Verdict:
        """The core's refusal check for one attempt, on this view, now.

        ``forwarded_for`` is the X-Forwarded-For chain (a header value or a sequence);
        ``trusted`` counts only with a ``device_id``. Raises CheckInputError.

        The applicable keys of a given set of arguments never change, so they are cached
        (bounded) with the attempt's account digest and source. While neither is the
        subject of an active decision, the core's ``DecisionIndex.may_apply`` says nothing
        can apply and the answer is "allowed" (the common case, two lookups); otherwise the
        core's ``DecisionIndex.check`` decides at ``now``.
        """
        memo = (tenant, account, source_ip, forwarded_for, device_id, trusted, flow, session_id)
        try:
            entry = self._memo_get(memo)
        except TypeError:  # an unhashable argument, e.g. forwarded_for given as a list
            entry = None
        if entry is None:
            entry = self._keys_of(memo)
        if not self._may_apply(entry[1], entry[2]):
            return ALLOWED
        return self.index.check(entry[0], self.now_ms())

    def _keys_of(self, memo: tuple[Any, ...]) -> _Memo:
        """Validate and normalise the arguments of a check (cache miss)."""
        tenant, account, source_ip, forwarded_for, device_id, trusted, flow, session_id = memo
        if flow not in FLOWS:
            raise CheckInputError("flow", "flow must be one of login, token, recovery, uia, mfa")
        if trusted.__class__ is not bool:
            raise CheckInputError("trusted", "trusted must be true or false")
        account_digest = self._accounts.get((tenant, account)) or self._account(tenant, account)
        hops = split_forwarded(forwarded_for)
        source = self._addresses.get((source_ip, hops)) or self._source(source_ip, hops)
        device = None
        if device_id:
            device = self._devices.get((tenant, device_id)) or self._device(tenant, device_id)
        session = None
        if session_id:
            session = self._sessions.get((tenant, session_id)) or self._session(tenant, session_id)
        keys = applicable_keys(
            sys.intern(tenant),
            account_digest,
            source,
            device,
            session,
            trusted and device is not None,
            flow,
        )
        entry = (keys, account_digest, source)
        if isinstance(forwarded_for, str | tuple) and _chars(forwarded_for) <= (
            FORWARDED_CACHED_MAX_CHARS
        ):
            memo_cache = self._keys
            if len(memo_cache) >= self._capacity:
                del memo_cache[next(iter(memo_cache))]
            memo_cache[memo] = entry
        return entry

    def _account(self, tenant: str, account: str) -> str:
        if not isinstance(account, str) or not 1 <= len(account) <= ACCOUNT_MAX_CHARS:
            raise CheckInputError("account", "account must be a string of 1 to 320 characters")
        _check_tenant(tenant)
        try:
            digest = self.normaliser.account_digest(tenant, account)
        except InvalidAttempt:
            raise CheckInputError("account", "account is blank after normalisation") from None
        return _remember(self._accounts, (tenant, account), sys.intern(digest), self._capacity)

    def _source(self, source_ip: str, hops: tuple[str, ...]) -> str:
        """The source of a peer and its normalised hops (``split_forwarded``), cached by
        both unless the hops are longer than ``FORWARDED_CACHED_MAX_CHARS``."""
        if not isinstance(source_ip, str) or not source_ip or len(source_ip) > IP_MAX_CHARS:
            raise CheckInputError("ip", "ip must be an IPv4 or IPv6 address")
        try:
            source = self.normaliser.sources.source_of(source_ip, hops)
        except InvalidAttempt:
            raise CheckInputError(
                "ip", f"ip {source_ip!r} is not an IPv4 or IPv6 address"
            ) from None
        if _chars(hops) > FORWARDED_CACHED_MAX_CHARS:
            return source
        return _remember(self._addresses, (source_ip, hops), sys.intern(source), self._capacity)

    def _device(self, tenant: str, device_id: str) -> str:
        digest = self.normaliser.digester.device(tenant, _handle("device", device_id))
        return _remember(self._devices, (tenant, device_id), sys.intern(digest), self._capacity)

    def _session(self, tenant: str, session_id: str) -> str:
        digest = self.normaliser.digester.session(tenant, _handle("session", session_id))
        return _remember(self._sessions, (tenant, session_id), sys.intern(digest), self._capacity)

    # -- the block-list ------------------------------------------------------------------

    def blocklist(
        self, *, include_observe: bool = False, tenant: str | None = None
    ) -> tuple[list[BlockEntry], int]:
        """Active source decisions (blocks; observe-only ones too if asked), and the time
        at which the first of them expires (the list is valid until then)."""
        now = self.now_ms()
        entries: list[BlockEntry] = []
        valid_until = 2**63 - 1
        for key, active in self._sources.items():
            if active.expires_ms <= now or (tenant is not None and key[1] != tenant):
                continue
            if active.action != "block" and not include_observe:
                continue
            source = key[3] or ""
            entries.append(
                BlockEntry(key[1], source, active.action, active.rule, active.decision_id,
                           active.expires_ms)
            )  # fmt: skip
            valid_until = min(valid_until, active.expires_ms)
        return entries, valid_until

    def counts(self) -> dict[tuple[str, str], int]:
        """Active decisions by (scope, action), for metrics."""
        now = self.now_ms()
        tally: dict[tuple[str, str], int] = {}
        for key, active in self.index.items():
            if active.expires_ms > now:
                slot = (key[0], active.action)
                tally[slot] = tally.get(slot, 0) + 1
        return tally


# -- the feed ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeedConfig:
    """How a feed reads the topic."""

    bootstrap_servers: str
    topic: str
    client_id: str = "authpipe-edge"
    poll_interval_ms: int = 200
    max_records_per_poll: int = 20_000
    max_partition_fetch_bytes: int = 8 << 20
    fetch_max_bytes: int = 64 << 20
    retry_backoff_s: float = 1.0
    request_timeout_ms: int = 30_000
    # TLS/SASL options of every client the feed opens (pipeline.kafka_client.security_kwargs).
    security: Mapping[str, Any] = field(default_factory=dict)


class DecisionFeed:
    """Follows the decisions topic into ``view``: ``await start()``, ``await stop()``."""

    def __init__(self, view: DecisionView, config: FeedConfig) -> None:
        self.view = view
        self.config = config
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._targets: dict[TopicPartition, int] = {}
        self._positions: dict[TopicPartition, int] = {}
        self._ready = asyncio.Event()
        self._waiting: str | None = f"connecting to the broker at {config.bootstrap_servers}"
        self._started_wall_ms = 0
        self.load_ms: int | None = None
        self.errors = 0

    @classmethod
    def from_settings(
        cls, settings: Settings, *, now_ms: Callable[[], int] = wall_ms
    ) -> DecisionFeed:
        """A feed of ``settings.kafka.decisions_topic`` into a view normalising exactly as
        the worker does (``build_normaliser``)."""
        view = DecisionView(build_normaliser(settings), now_ms=now_ms)
        from pipeline.kafka_client import security_kwargs

        kafka = settings.kafka
        config = FeedConfig(kafka.bootstrap_servers, kafka.decisions_topic, security=security_kwargs(kafka))
        return cls(view, config)

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start following in the background (returns at once; see ``wait_ready``)."""
        if self._task is None:
            self._started_wall_ms = wall_ms()
            self._task = asyncio.create_task(self._supervise(), name="authpipe-edge-feed")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> DecisionFeed:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once caught up with the end offsets seen at start; FeedNotReady after
        ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._ready.wait()
        except TimeoutError:
            raise FeedNotReady(
                f"the decision feed of {self.config.topic!r} did not catch up within "
                f"{timeout_s:g}s (lag {self.lag_messages()} messages); check the broker at "
                f"{self.config.bootstrap_servers}"
            ) from None

    # -- health --------------------------------------------------------------------------

    def ready(self) -> bool:
        return self._ready.is_set()

    def not_ready_reason(self) -> str | None:
        """Why the view is not ready (None once it is): what it waits for, in words."""
        if self._ready.is_set():
            return None
        if self._waiting is not None:
            return self._waiting
        return f"catching up with topic {self.config.topic!r} ({self.lag_messages()} messages behind)"

    def lag_messages(self) -> int:
        """Messages on the broker not applied yet (end offsets as last seen)."""
        consumer = self._consumer
        lag = 0
        for tp, target in self._targets.items():
            high = consumer.highwater(tp) if consumer is not None else None
            lag += max(0, (high if high is not None else target) - self._positions.get(tp, 0))
        return lag

    def staleness_ms(self) -> int | None:
        """Milliseconds since the broker last answered a fetch for every partition (None
        before the first answers)."""
        consumer = self._consumer
        if consumer is None or not self._targets:
            return None
        stamps: list[int | None] = [consumer.last_poll_timestamp(tp) for tp in self._targets]
        known = [stamp for stamp in stamps if stamp is not None]
        if len(known) < len(stamps):
            return None
        return max(0, wall_ms() - min(known))

    # -- the loop ------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Run the follow loop; on a broker error, log, back off and start over."""
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except (KafkaError, OSError, EdgeError) as exc:
                self.errors += 1
                self._waiting = (
                    f"the broker at {self.config.bootstrap_servers} failed: {exc!r}"[:300]
                )
                log.warning("edge_feed_error", topic=self.config.topic, error=repr(exc)[:300])
            except Exception:
                # A bug must not end enforcement: log it, then read the topic again.
                self.errors += 1
                self._waiting = "the decision feed failed; see edge_feed_crashed in the edge's log"
                log.exception("edge_feed_crashed", topic=self.config.topic)
            await asyncio.sleep(self.config.retry_backoff_s)

    async def _follow(self) -> None:
        cfg = self.config
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap_servers,
            client_id=cfg.client_id,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=cfg.request_timeout_ms,
            max_partition_fetch_bytes=cfg.max_partition_fetch_bytes,
            fetch_max_bytes=cfg.fetch_max_bytes,
            **cfg.security,
        )
        await consumer.start()
        self._consumer = consumer
        try:
            partitions = await self._assign(consumer)
            await self._read(consumer, partitions)
        finally:
            self._consumer = None
            await consumer.stop()

    async def _assign(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        topic = self.config.topic
        warned_at: float | None = None
        while not (ids := await self._partition_ids()):
            self._waiting = (
                f"topic {topic!r} does not exist on {self.config.bootstrap_servers}: start the "
                "worker that creates it, or set AUTHPIPE_KAFKA_DECISIONS_TOPIC to the topic "
                "your worker writes decisions to"
            )
            if warned_at is None or time.monotonic() - warned_at >= TOPIC_MISSING_LOG_S:
                log.warning("edge_topic_missing", topic=topic, reason=self._waiting)
                warned_at = time.monotonic()
            await asyncio.sleep(self.config.retry_backoff_s)
        self._waiting = None
        partitions = [TopicPartition(topic, pid) for pid in ids]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        self._targets = dict(await consumer.end_offsets(partitions))
        log.info(
            "edge_feed_assigned",
            topic=topic,
            partitions=len(partitions),
            messages_at_start=sum(self._targets.values()),
        )
        return partitions

    async def _partition_ids(self) -> list[int]:
        """The topic's partitions from a metadata request for all topics (asking by name
        could auto-create the topic); empty while it does not exist."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.config.bootstrap_servers,
            client_id=self.config.client_id,
            request_timeout_ms=self.config.request_timeout_ms,
            **self.config.security,
        )
        await admin.start()
        try:
            described: list[dict[str, Any]] = await admin.describe_topics()
        finally:
            await admin.close()
        for entry in described:
            if entry.get("topic") == self.config.topic and entry.get("error_code", 0) == 0:
                return sorted(int(p["partition"]) for p in entry.get("partitions") or [])
        return []

    async def _read(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> None:
        view = self.view
        cfg = self.config
        while True:
            batches = await consumer.getmany(
                *partitions, timeout_ms=cfg.poll_interval_ms, max_records=cfg.max_records_per_poll
            )
            # In chunks, yielding to the loop once APPLY_BUDGET_S has passed: a large batch
            # (cold load, a burst of decisions) must not stall the checks served on this
            # loop by more than about a millisecond.
            deadline_s = time.perf_counter() + APPLY_BUDGET_S
            for records in batches.values():
                for start in range(0, len(records), APPLY_CHUNK):
                    if time.perf_counter() >= deadline_s:
                        await asyncio.sleep(0)
                        deadline_s = time.perf_counter() + APPLY_BUDGET_S
                    view.apply_batch(records[start : start + APPLY_CHUNK])
            view.prune()
            for tp in partitions:
                self._positions[tp] = await consumer.position(tp)
            self._note_ready()

    def _note_ready(self) -> None:
        if self._ready.is_set():
            return
        if all(self._positions.get(tp, 0) >= end for tp, end in self._targets.items()):
            settle_heap()
            self.load_ms = wall_ms() - self._started_wall_ms
            self._ready.set()
            log.info(
                "edge_view_ready",
                topic=self.config.topic,
                decisions=len(self.view),
                load_ms=self.load_ms,
                bad_messages=self.view.stats.outcomes["bad"],
            )
