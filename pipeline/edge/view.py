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
* Messages are applied as they come (``apply``, ``apply_batch``): a decision replaces its
  key, a tombstone lifts it, and a decision whose ``expires_at`` has passed is dropped at
  once (an active one stops counting at its ``expires_at`` even if no tombstone ever
  arrives). A message that is not a valid decision is logged and counted, and changes
  nothing: the key keeps its last good decision until a tombstone or its expiry (a
  malformed value must not lift a block).

The clock is injected (``now_ms``), so tests control expiry. ``pipeline.edge.feed``
fills a view from the topic.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline.clock import wall_ms
from pipeline.contracts.codec import DecodeError
from pipeline.core.decision_keys import applicable_keys
from pipeline.core.decisions import ALLOWED, Active, DecisionIndex, Verdict
from pipeline.core.errors import InvalidAttempt
from pipeline.core.familiar_store import FetchedBatches
from pipeline.core.keys import Key, format_key
from pipeline.core.policy import Policy
from pipeline.core.review import review_session
from pipeline.edge.blocklist import BlockEntry, valid_source
from pipeline.edge.changes import ChangeSignal
from pipeline.edge.decode import decode_decision, decode_key
from pipeline.edge.errors import CheckInputError
from pipeline.edge.inputs import (
    forwarded_chars,
    require_account,
    require_flow,
    require_handle,
    require_ip,
    require_tenant,
    require_trusted,
    split_forwarded,
)
from pipeline.logs import get_logger

if TYPE_CHECKING:
    from pipeline.core.attempt import Normaliser

log = get_logger("edge")

CACHE_ENTRIES = 65_536
FORWARDED_CACHED_MAX_CHARS = 256
"""Checks whose ``forwarded_for`` is longer are answered without caching (a proxy chain
is a few hops of 7 to 45 characters; longer text is a client's to vary at will)."""
OUTCOMES = ("put", "lift", "expired", "bad")
SESSION_SKEW_MS = 300_000
"""A session review's sign-in time may be this far past the edge's clock (skew) and is
then read as now; further is a bad parameter."""


@dataclass(slots=True)
class ViewStats:
    """Counts of applied messages by outcome, and of bad ones by reason."""

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    bad_reasons: dict[str, int] = field(default_factory=dict)
    pruned: int = 0


# -- the view ---------------------------------------------------------------------------


_Memo = tuple[tuple[Key, ...], str, str]
"""What a check's arguments come to: the applicable keys, the account digest, the source."""


def _bump(signal: ChangeSignal, times: int) -> None:
    """``times`` bumps of ``signal`` at once (its waiters woken once)."""
    signal.version += times - 1
    signal.bump()


def _remember(cache: OrderedDict[Any, str], key: Any, value: str, capacity: int) -> str:
    """``value`` kept under ``key``, the oldest entry dropped when full. The caches are
    ``OrderedDict``s: deleting a plain dict's first entry leaves a hole that every later
    ``next(iter(cache))`` walks over until the dict is rebuilt, so a full 65,536-entry
    cache cost 7.5-63 us per new entry (0.4-1.5 us with ``popitem(last=False)``)."""
    if len(cache) >= capacity:
        cache.popitem(last=False)
    cache[key] = value
    return value


class DecisionView:
    """Active decisions by key, fed message by message; ``check`` without I/O."""

    def __init__(
        self,
        normaliser: Normaliser,
        *,
        now_ms: Callable[[], int] = wall_ms,
        cache_entries: int = CACHE_ENTRIES,
        policy: Policy | None = None,
    ) -> None:
        self.normaliser = normaliser
        self.now_ms = now_ms
        # The policy's [verify]: the workers' file (settings.policy_path), read alike here.
        self.index = DecisionIndex(announce=False, policy=policy)
        self.stats = ViewStats()
        self.changes = ChangeSignal()
        self.blocklist_changes = ChangeSignal()
        self._sources: dict[Key, Active] = {}
        self.tenants: set[str] = {"default"}
        """Tenants a decision has named (and ``default``): the feed serves these."""
        self._capacity = cache_entries
        self._accounts: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._addresses: OrderedDict[tuple[str, tuple[str, ...]], str] = OrderedDict()
        self._devices: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._sessions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._keys: OrderedDict[tuple[Any, ...], _Memo] = OrderedDict()
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
        """Apply fetched records (objects with ``key`` and ``value``) as ``apply_encoded``
        does; returns how many."""
        batch = records if isinstance(records, list) else list(records)
        return self.apply_encoded([r.key for r in batch], [r.value for r in batch])

    def apply_encoded(self, keys: list[bytes | None], values: list[bytes | None]) -> int:
        """Apply messages (``keys[i]``, ``values[i]``) as ``apply`` does one by one, with the
        clock read once; returns how many. With the compiled store, its engine decodes and
        applies the familiar exempts and their tombstones itself
        (``DecisionIndex.apply_familiar_encoded``: about 1 us each, against 10 to 20 here)
        and hands every other message back to ``apply``'s path, after it: each key's
        messages apply in order, a bad one is counted and logged as ever."""
        now = self.now_ms()
        apply = self._apply
        batch = self.index.apply_familiar_encoded(keys, values, now)
        if batch is None:
            for key, value in zip(keys, values, strict=True):
                apply(key, value, now)
            return len(keys)
        self._count_batch(batch.put, batch.lifted, batch.expired, batch.changed, batch.tenants)
        for i in batch.handed_back:
            apply(keys[i], values[i], now)
        return len(keys)

    @property
    def reads_batches(self) -> bool:
        """Whether ``apply_fetched`` can read record batches (the compiled store is in)."""
        return self.index.stores_familiar

    def apply_fetched(
        self, raw: bytes | bytearray, from_offset: int, start: int = 0, end: int | None = None
    ) -> FetchedBatches:
        """Apply one partition's records of a fetch answer (``raw[start:end]``: record
        batches, read from ``from_offset``) as ``apply_encoded`` applies the same
        messages, the engine reading the batches; returns what it read (``next_offset``;
        ``unread``: a batch left for a consumer). Only with the compiled store
        (``reads_batches``)."""
        now = self.now_ms()
        batch = self.index.apply_familiar_batches(raw, from_offset, now, start, end)
        if batch is None:
            raise RuntimeError("apply_fetched needs the compiled store (reads_batches)")
        self._count_batch(batch.put, batch.lifted, batch.expired, batch.changed, batch.tenants)
        apply = self._apply
        for key, value in batch.handed_back:
            apply(key, value, now)
        return batch

    def _count_batch(
        self, put: int, lifted: int, expired: int, changed: int, tenants: list[str]
    ) -> None:
        outcomes = self.stats.outcomes
        outcomes["put"] += put
        outcomes["lift"] += lifted
        outcomes["expired"] += expired
        if changed:
            _bump(self.changes, changed)
        if tenants:
            self.tenants.update(tenants)

    def _apply(self, key: bytes | None, value: bytes | None, now_ms: int) -> str:
        try:
            rules = self.normaliser.sources
            decision_key, wire_key = decode_key(
                key, rules.ipv4_prefix, rules.ipv6_prefix, rules.nat64_prefixes
            )
        except DecodeError as exc:
            return self._bad(exc, None)
        if value is None:
            self._lift(decision_key)
            return self._count("lift")
        try:
            active = decode_decision(wire_key, value, self._source_ok(decision_key))
        except DecodeError as exc:
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

    def _source_ok(self, decision_key: Key) -> Callable[[str], bool]:
        """The grouping check of a value's source: the key's own source passed it already
        (``decode_key``), so only a value naming another source is checked again."""
        rules = self.normaliser.sources
        return lambda source: (
            source == decision_key[3]
            or valid_source(source, rules.ipv4_prefix, rules.ipv6_prefix, rules.nat64_prefixes)
        )

    def _count(self, outcome: str) -> str:
        self.stats.outcomes[outcome] += 1
        return outcome

    def _bad(self, exc: DecodeError, key: Key | None) -> str:
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
        if not self._may_apply(tenant, entry[1], entry[2]):
            pair, client = entry[0][0], entry[0][1]
            if pair[0] != "familiar":  # not an untrusted password attempt
                return ALLOWED
            return self.index.unfamiliar(tenant, entry[1], entry[2], client[4], self.now_ms())
        return self.index.check(entry[0], self.now_ms())

    def review_session(
        self,
        tenant: str,
        account: str,
        source_ip: str,
        signed_in_ms: int,
        forwarded_for: str | Sequence[str] = (),
        device_id: str | None = None,
    ) -> str | None:
        """The step-up a session now owes (``"step_up"``) or None: the core's
        ``review_session`` on this view, now, after the check's normalisation. Ask it for
        a session signed in from an untrusted client without a challenge. Raises
        CheckInputError."""
        require_tenant(tenant)
        now = self.now_ms()
        if signed_in_ms > now + SESSION_SKEW_MS:
            raise CheckInputError(
                "signed_in_at_ms",
                "signed_in_at_ms is in the future; send the session's sign-in time, epoch ms",
            )
        account_digest, source, device = self._subjects(
            tenant, account, source_ip, forwarded_for, device_id
        )
        # A login service's clock a little ahead of this one's is not a bad request.
        signed_in_ms = min(signed_in_ms, now)
        return review_session(self.index, tenant, account_digest, source, device, signed_in_ms, now)

    def _keys_of(self, memo: tuple[Any, ...]) -> _Memo:
        """Validate and normalise the arguments of a check (cache miss)."""
        tenant, account, source_ip, forwarded_for, device_id, trusted, flow, session_id = memo
        require_flow(flow)
        require_trusted(trusted)
        account_digest, source, device = self._subjects(
            tenant, account, source_ip, forwarded_for, device_id
        )
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
        if isinstance(forwarded_for, str | tuple) and forwarded_chars(forwarded_for) <= (
            FORWARDED_CACHED_MAX_CHARS
        ):
            memo_cache = self._keys
            if len(memo_cache) >= self._capacity:
                memo_cache.popitem(last=False)
            memo_cache[memo] = entry
        return entry

    def _subjects(
        self,
        tenant: str,
        account: str,
        source_ip: str,
        forwarded_for: str | Sequence[str],
        device_id: str | None,
    ) -> tuple[str, str, str | None]:
        """The account digest, the source and the device digest (None without a device)
        of a check's or a review's arguments, through the bounded caches."""
        account_digest = self._accounts.get((tenant, account)) or self._account(tenant, account)
        hops = split_forwarded(forwarded_for)
        source = self._addresses.get((source_ip, hops)) or self._source(source_ip, hops)
        device = None
        if device_id:
            device = self._devices.get((tenant, device_id)) or self._device(tenant, device_id)
        return account_digest, source, device

    def _account(self, tenant: str, account: str) -> str:
        require_account(account)
        require_tenant(tenant)
        try:
            digest = self.normaliser.account_digest(tenant, account)
        except InvalidAttempt:
            raise CheckInputError("account", "account is blank after normalisation") from None
        return _remember(self._accounts, (tenant, account), sys.intern(digest), self._capacity)

    def _source(self, source_ip: str, hops: tuple[str, ...]) -> str:
        """The source of a peer and its normalised hops (``split_forwarded``), cached by
        both unless the hops are longer than ``FORWARDED_CACHED_MAX_CHARS``."""
        require_ip(source_ip)
        try:
            source = self.normaliser.sources.source_of(source_ip, hops)
        except InvalidAttempt:
            raise CheckInputError(
                "ip", f"ip {source_ip!r} is not an IPv4 or IPv6 address"
            ) from None
        if forwarded_chars(hops) > FORWARDED_CACHED_MAX_CHARS:
            return source
        return _remember(self._addresses, (source_ip, hops), sys.intern(source), self._capacity)

    def _device(self, tenant: str, device_id: str) -> str:
        digest = self.normaliser.digester.device(tenant, require_handle("device", device_id))
        return _remember(self._devices, (tenant, device_id), sys.intern(digest), self._capacity)

    def _session(self, tenant: str, session_id: str) -> str:
        digest = self.normaliser.digester.session(tenant, require_handle("session", session_id))
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
                BlockEntry(
                    key[1],
                    source,
                    active.action,
                    active.rule,
                    active.decision_id,
                    active.expires_ms,
                )
            )
            valid_until = min(valid_until, active.expires_ms)
        return entries, valid_until

    def counts(self) -> dict[tuple[str, str], int]:
        """Active decisions by (scope, action), for metrics."""
        now = self.now_ms()
        tally: dict[tuple[str, str], int] = {}
        items = self.index.items()
        for key, active in items:
            if active.expires_ms > now:
                slot = (key[0], active.action)
                tally[slot] = tally.get(slot, 0) + 1
        # The compiled store's familiar exempts are not in ``items``: counted as held (those
        # expired but not yet pruned too), which costs nothing, where counting the alive
        # ones scans every record on each scrape.
        stored = len(self.index) - len(items)
        if stored:
            tally[("familiar", "exempt")] = tally.get(("familiar", "exempt"), 0) + stored
        return tally
