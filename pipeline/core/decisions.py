"""The refusal check, shared by the worker (for audit) and the edge (for enforcement):
the decision index (active decisions by key, lazy expiry, familiar exempts in the
compiled store when installed) and its verdicts. Which keys apply to an attempt is
``pipeline.core.decision_keys``'s.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, NamedTuple

from pipeline.contracts.models import Decision, datetime_to_ms
from pipeline.core.decision_keys import VERIFY
from pipeline.core.familiar_store import FAMILIAR_ENGINE, FamiliarBatch, FetchedBatches
from pipeline.core.keys import Key
from pipeline.core.policy import Policy


class Active(NamedTuple):
    """What the index keeps of a decision: enough to refuse, and the id for operators.

    A NamedTuple, built in one step (mypyc leaves a frozen dataclass interpreted: see
    bench/README.md, "Records the compiled core can build")."""

    decision_id: str
    action: str
    expires_ms: int
    rule: str
    challenge: str | None = None
    since_ms: int = -1
    """When the decision's evidence began (``evidence_since_ms``); -1 where the holder
    does not need it (the worker's own index)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of the check. Only ``allowed``, ``retry_after_ms`` and ``challenge``
    go to clients."""

    allowed: bool
    retry_after_ms: int
    matched_key: Key | None = None
    observed_key: Key | None = None
    challenge: str | None = None
    challenge_key: Key | None = None
    step_up: bool = False
    """A right password must be answered by a possession check before any session:
    ``challenge == "step_up"``, or a ``captcha`` first at an unfamiliar place and client
    of a tenant that verifies them (``VerifyConfig``)."""

    @property
    def applied(self) -> str:
        if not self.allowed:
            return "block"
        if self.challenge is not None:
            return "challenge"
        return "observe" if self.observed_key else "allowed"


ALLOWED = Verdict(True, 0)
HEAP_SLACK = 1024
"""Stale heap entries a decision index tolerates beyond twice its active decisions."""
FAMILIAR_RULE = "familiar"
PRUNE_STEP_SLOTS = 65_536
"""Slots of the compiled familiar store one ``prune`` of a reader sweeps (under a
millisecond, bench/README.md "B8"): the whole store every ``slots / 65,536`` prunes;
an expired record is ignored by every lookup until the sweep removes it."""


class DecisionIndex:
    """Active decisions by key, with lazy expiry from a heap ordered by ``expires_ms``.

    ``check`` ignores expired entries even before ``prune`` removes them, so a decision
    whose tombstone never arrives stops being enforced at its ``expires_at``.

    The heaps hold at most ``2 * len(self) + HEAP_SLACK`` entries each: a decision renewed
    or lifted before its expiry leaves its old entry behind (a familiar pair renewed daily
    for 30 days would leave 30), so once a heap outgrows that it is rebuilt from the active
    decisions. What ``prune`` and ``announce_expired`` return is unchanged by it: they skip
    entries that are no longer current anyway.

    ``subjects`` counts the active decisions per subject (the account digest of a key, or
    its source when it has no account): an attempt whose account and source are both
    absent there cannot be refused, which ``may_apply`` answers with two string lookups
    instead of building the attempt's keys. That is the common case on the hot path.

    A reader's (``announce`` off: the edge, a replay) familiar exempts go to the compiled
    engine's ``FamiliarStore`` when there is one (``engine``, by default
    ``FAMILIAR_ENGINE``; issue 45): about 48 bytes each, keyed by ``familiar_digest``,
    instead of about 800 in the dict and heap, since every edge holds every tenant's.
    What they answer is the same, with three differences: ``get`` and ``lift`` give the
    decision id as its 64-bit fingerprint in hex; ``items`` and ``prune`` do not name
    them (the store keeps no key: ``familiar_alive`` counts them); and ``prune`` sweeps
    ``PRUNE_STEP_SLOTS`` of the store per call rather than all of it. A worker keeps its
    own in the dict: its ``prune`` must name each expired one to tombstone it.
    """

    __slots__ = (
        "_active",
        "_announce",
        "_announced",
        "_engine",
        "_familiar",
        "_heap",
        "_held",
        "_pushed",
        "_verify",
        "_verify_default",
        "_wall_heap",
        "subjects",
    )

    def __init__(
        self, announce: bool = True, policy: Policy | None = None, engine: Any = FAMILIAR_ENGINE
    ) -> None:
        # Per tenant, [verify] mode (off, observe, enforce): the policy's, so the worker,
        # the edge and a replay given the same file answer alike, with no decision.
        self._verify_default = policy.defaults.verify.mode if policy is not None else "off"
        self._verify: dict[str, str] = (
            {name: rules.verify.mode for name, rules in policy.tenants.items()}
            if policy is not None
            else {}
        )
        self._active: dict[Key, Active] = {}
        # Heap entries (expiry, decision id, push count, key): the push count breaks a tie
        # between two keys whose decisions share expiry and id (only a buggy or hostile
        # producer's), so keys, which may hold None, are never compared.
        self._pushed = 0
        self._heap: list[tuple[int, str, int, Key]] = []
        # Decisions already tombstoned because the wall clock passed their expiry
        # (``announce_expired``): still in force for events older than that, never
        # tombstoned twice. Only a worker announces (``announce``): a reader such as the
        # edge never drains this heap, so it keeps none (it would grow with every
        # decision ever applied).
        self._announce = announce
        self._wall_heap: list[tuple[int, str, int, Key]] = []
        self._announced: dict[Key, str] = {}
        self.subjects: dict[str, int] = {}
        self._engine: Any = None if announce else engine
        self._familiar: Any = None if self._engine is None else self._engine.FamiliarStore()
        # The digests of the familiar keys whose decision is in the dict (not a plain
        # exempt): ``apply_familiar_encoded`` hands their messages back.
        self._held: Any = None if self._engine is None else self._engine.FamiliarStore()

    def __len__(self) -> int:
        if self._familiar is None:
            return len(self._active)
        return len(self._active) + len(self._familiar)

    def put(self, key: Key, active: Active) -> None:
        if self._familiar is not None and key[0] == "familiar" and self._put_familiar(key, active):
            return
        # An exempt refuses and demands nothing on its own: it is not a subject, so an
        # account whose only decisions are exempts stays on the two-lookup fast path. A
        # decision replacing another on its key counts as its own action says.
        old = self._active.get(key)
        if old is None:
            if self._held is not None and key[0] == "familiar":
                self._held.put(self._engine.familiar_digest(key[1], key[2], key[3], key[4]), 0)
            if active.action != "exempt":
                self._count(key, 1)
        elif (old.action == "exempt") != (active.action == "exempt"):
            self._count(key, -1 if active.action == "exempt" else 1)
        self._active[key] = active
        self._pushed += 1
        entry = (active.expires_ms, active.decision_id, self._pushed, key)
        heapq.heappush(self._heap, entry)
        if self._announce:
            heapq.heappush(self._wall_heap, entry)
        bound = 2 * len(self._active) + HEAP_SLACK
        if len(self._heap) > bound or len(self._wall_heap) > bound:
            self._compact()

    def _put_familiar(self, key: Key, active: Active) -> bool:
        """Put a familiar exempt into the compiled store (True); for any other decision on
        a familiar key, drop the store's record and return False (the dict takes it)."""
        engine = self._engine
        digest = engine.familiar_digest(key[1], key[2], key[3], key[4])
        if (
            active.action == "exempt"
            and active.rule == FAMILIAR_RULE
            and active.challenge is None
            and active.expires_ms >= 0
            and active.since_ms >= -1
        ):
            old = self._active.pop(key, None)
            if old is not None:
                self._forget(key, old)
            fingerprint = engine.id_fingerprint(active.decision_id)
            self._familiar.put(digest, active.expires_ms, active.since_ms, fingerprint)
            return True
        self._familiar.lift(digest)
        return False

    def _stored(self, key: Key) -> Active | None:
        """The compiled store's exempt on a familiar ``key``, as the dict would hold it
        (its decision id as the fingerprint's 16 hex digits), or None."""
        record = self._familiar.get_key(key[1], key[2], key[3], key[4])
        if record is None:
            return None
        expires_ms, since_ms, fingerprint = record
        return Active(f"{fingerprint:016x}", "exempt", expires_ms, FAMILIAR_RULE, None, since_ms)

    @property
    def stores_familiar(self) -> bool:
        """Whether familiar exempts are kept in the compiled store (a reader with the
        engine), so ``apply_familiar_encoded`` and ``apply_familiar_batches`` apply."""
        return self._familiar is not None

    def familiar_alive(self, now_ms: int) -> int:
        """Familiar exempts in the compiled store alive at ``now_ms`` (0 without one): what
        ``items`` does not list. Scans the store."""
        return 0 if self._familiar is None else int(self._familiar.count_alive(now_ms))

    def reserve_familiar(self, records: int) -> None:
        """Make room for ``records`` more familiar exempts at once (a cold load that knows
        its size), so the store never grows while loading them; nothing without a store."""
        if self._familiar is not None:
            self._familiar.reserve(records)

    def apply_familiar_encoded(
        self, keys: list[bytes | None], values: list[bytes | None], now_ms: int
    ) -> FamiliarBatch | None:
        """Apply a fetch of the decisions topic's messages (Kafka keys and values, a value
        of None a tombstone) at ``now_ms`` as a reader applies them one by one (an exempt
        expired at ``now_ms`` lifts its key), for those the compiled store reads itself:
        familiar exempts and tombstones of familiar keys, decoded in the engine
        (``FamiliarStore.put_encoded``, engine/src/decode.rs). Every other message, and
        every later one of a key whose message was handed back or whose decision is in the
        dict, is handed back (``FamiliarBatch.handed_back``) for the caller to apply, in
        order, after this call: each key's messages still apply in order. None without a
        store: every message is the caller's."""
        if self._familiar is None:
            return None
        return FamiliarBatch._make(self._familiar.put_encoded(keys, values, now_ms, self._held))

    def apply_familiar_batches(
        self,
        raw: bytes | bytearray,
        from_offset: int,
        now_ms: int,
        start: int = 0,
        end: int | None = None,
    ) -> FetchedBatches | None:
        """``apply_familiar_encoded`` of the messages in a fetch answer's record batches
        (``raw[start:end]``, one partition's records as the broker sent them, read from
        ``from_offset``) without a Python object per message: the engine reads the
        batches (``FamiliarStore.put_batches``, engine/src/batch.rs) and hands back only
        the messages it does not apply. None without a store."""
        if self._familiar is None:
            return None
        return FetchedBatches._make(
            self._familiar.put_batches(raw, from_offset, now_ms, self._held, start, end)
        )

    def _compact(self) -> None:
        """Rebuild the heaps from the active decisions (the wall heap without those the
        wall clock already announced): drops the entries of renewed and lifted ones."""
        active, announced, first = self._active, self._announced, self._pushed + 1
        entries = [
            (a.expires_ms, a.decision_id, n, key)
            for n, (key, a) in enumerate(active.items(), first)
        ]
        self._pushed += len(entries)
        self._heap = entries
        heapq.heapify(self._heap)
        if self._announce:
            self._wall_heap = [e for e in entries if announced.get(e[3]) != e[1]]
            heapq.heapify(self._wall_heap)

    def lift(self, key: Key) -> Active | None:
        """Remove ``key``'s decision; returns it, or None when there is none (or when the
        wall clock already tombstoned it: the caller must not tombstone it again)."""
        active = self._active.pop(key, None)
        if active is not None:
            self._forget(key, active)
            if self._announced.pop(key, None) == active.decision_id:
                return None
        elif self._familiar is not None and key[0] == "familiar":
            active = self._stored(key)
            if active is not None:
                self._familiar.lift(self._engine.familiar_digest(key[1], key[2], key[3], key[4]))
        return active

    def announce_expired(self, wall_ms: int) -> list[Key]:
        """Keys whose decision expired on the wall clock and was not tombstoned yet. They
        stay in the index (an event older than the expiry still finds them) until
        ``prune`` reaches them in event time, which then does not return them again."""
        heap = self._wall_heap
        out: list[Key] = []
        while heap and heap[0][0] <= wall_ms:
            _, decision_id, _, key = heapq.heappop(heap)
            current = self._active.get(key)
            if current is not None and current.decision_id == decision_id:
                self._announced[key] = decision_id
                out.append(key)
        return out

    def _forget(self, key: Key, active: Active) -> None:
        """``key``'s decision ``active`` left the dict."""
        if self._held is not None and key[0] == "familiar":
            self._held.lift(self._engine.familiar_digest(key[1], key[2], key[3], key[4]))
        if active.action != "exempt":
            self._count(key, -1)

    def _count(self, key: Key, change: int) -> None:
        """Count one active decision more (1) or less (-1) for ``key``'s subject."""
        subject = _subject(key)
        left = self.subjects.get(subject, 0) + change
        if left:
            self.subjects[subject] = left
        else:
            del self.subjects[subject]

    def may_apply(self, tenant: str, account: str, source: str) -> bool:
        """False when no active decision can concern this account or source, nor the
        tenant as a whole (a wave challenge)."""
        subjects = self.subjects
        return bool(subjects) and (account in subjects or source in subjects or tenant in subjects)

    def verify_mode(self, tenant: str) -> str:
        """The tenant's ``[verify] mode``: off, observe or enforce."""
        return self._verify.get(tenant, self._verify_default)

    def unfamiliar(
        self, tenant: str, account: str, source: str, device: str | None, now_ms: int
    ) -> Verdict:
        """The verdict of an untrusted password attempt that no decision concerns
        (``may_apply`` was False): ``step_up`` when the tenant verifies unfamiliar sign-ins
        and neither the pair's nor the client's familiar exempt covers it, its observe
        twin in observe mode, else allowed. What ``check`` answers such an attempt, in one
        to three lookups."""
        mode = self._verify.get(tenant, self._verify_default)
        if mode == "off":
            return ALLOWED
        active = self._active
        store = self._familiar
        # The pair's entry, else (only when the pair has none, alive or not) the client's;
        # from the dict, else the compiled store, whose records are all exempts.
        record: tuple[int, int, int] | None = None
        exempt = active.get(("familiar", tenant, account, source, None))
        if exempt is None and store is not None:
            record = store.get_key(tenant, account, source, None)
        if exempt is None and record is None and device is not None:
            exempt = active.get(("familiar", tenant, account, None, device))
            if exempt is None and store is not None:
                record = store.get_key(tenant, account, None, device)
        if exempt is not None:
            if exempt.expires_ms > now_ms and exempt.action == "exempt":
                return ALLOWED
        elif record is not None and record[0] > now_ms:
            return ALLOWED
        at: Key = ("tenant", tenant, None, None, VERIFY)
        if mode == "enforce":
            return Verdict(True, 0, None, None, "step_up", at, True)
        return Verdict(True, 0, None, at)

    def get(self, key: Key) -> Active | None:
        entry = self._active.get(key)
        if entry is None and self._familiar is not None and key[0] == "familiar":
            return self._stored(key)
        return entry

    def items(self) -> list[tuple[Key, Active]]:
        return list(self._active.items())

    def prune(self, now_ms: int) -> list[Key]:
        """Remove decisions expired at ``now_ms``; returns their keys."""
        heap = self._heap
        removed: list[Key] = []
        while heap and heap[0][0] <= now_ms:
            _, decision_id, _, key = heapq.heappop(heap)
            current = self._active.get(key)
            if current is not None and current.decision_id == decision_id:
                del self._active[key]
                self._forget(key, current)
                if self._announced.pop(key, None) != decision_id:
                    removed.append(key)
        if self._familiar is not None:
            self._familiar.prune_step(now_ms, PRUNE_STEP_SLOTS)
        return removed

    def check(self, keys: tuple[Key, ...], now_ms: int) -> Verdict:
        """Refused iff an unexpired block applies; retry after the longest remaining one.
        Else the first unexpired challenge names what to demand. An ``exempt`` on the
        familiar pair or client (first among the keys) voids the tenant's wave challenge
        and the rules' source decisions for this attempt; operators' decisions still
        apply. A ``passed`` exempt (the client passed a CAPTCHA for the account, third
        among the keys) voids every CAPTCHA, nothing else. When the tenant verifies unfamiliar sign-ins (``VerifyConfig``), every
        untrusted password attempt the familiar exempts do not cover is asked a
        ``step_up`` after a correct password (``Verdict.step_up``), after the wave's or
        the source's CAPTCHA if one is in force. Nothing else softens a challenge: one
        account's success at a place proves nothing about another's."""
        retry_ms = 0
        matched: Key | None = None
        observed: Key | None = None
        challenge: Key | None = None
        kind: str | None = None
        exempt = passed = False
        active = self._active
        store = self._familiar
        for key in keys:
            entry = active.get(key)
            if entry is None:
                if store is not None and key[0] == "familiar":  # the store's: exempts only
                    record = store.get_key(key[1], key[2], key[3], key[4])
                    if record is not None and record[0] > now_ms:
                        exempt = True
                continue
            if entry.expires_ms <= now_ms:
                continue
            action = entry.action
            if action == "exempt":
                if key[0] == "passed":
                    passed = True
                else:
                    exempt = True
                continue
            if exempt and (key[0] == "tenant" or (key[0] == "source" and key[4] is None)):
                continue
            if action == "block":
                remaining = entry.expires_ms - now_ms
                if remaining > retry_ms:
                    retry_ms, matched = remaining, key
            elif action == "challenge":
                if key[0] == "source" and keys[0][0] != "familiar":
                    continue  # a source's CAPTCHA is for password flows (they lead with familiar)
                if passed and entry.challenge == "captcha":
                    continue
                if challenge is None:
                    challenge, kind = key, entry.challenge
            elif observed is None:
                observed = key
        if matched is not None:
            return Verdict(False, retry_ms, matched, observed)
        first = keys[0]
        if first[0] == "familiar" and not exempt:  # an untrusted password attempt, unfamiliar
            mode = self._verify.get(first[1], self._verify_default)
            if mode == "enforce":
                if challenge is None:
                    challenge, kind = ("tenant", first[1], None, None, VERIFY), "step_up"
                return Verdict(True, 0, None, observed, kind, challenge, True)
            if mode == "observe" and observed is None:
                observed = ("tenant", first[1], None, None, VERIFY)
        if challenge is not None:
            return Verdict(True, 0, None, observed, kind, challenge, kind == "step_up")
        return Verdict(True, 0, None, observed) if observed else ALLOWED


def evidence_since_ms(scope: str, issued_ms: int, window_ms: int) -> int:
    """When a decision's evidence began, as ``review_session`` reads it: a wave's lead-in
    start (``issued_at - window_ms``, ``pipeline.core.rollup``; -1, no lead-in, when
    ``window_ms`` is 0), any other decision's ``issued_at`` (a familiar pair is familiar
    from then)."""
    if scope == "tenant":
        return issued_ms - window_ms if window_ms > 0 else -1
    return issued_ms


def active_of(d: Decision) -> Active:
    """A decision as an index keeps it."""
    issued = datetime_to_ms(d.issued_at)
    return Active(
        d.decision_id,
        d.action,
        datetime_to_ms(d.expires_at),
        d.rule,
        d.challenge,
        evidence_since_ms(d.scope, issued, d.window_ms),
    )


def index_wave(index: DecisionIndex, decisions: list[tuple[str, Decision]]) -> None:
    """Put the rollup's wave decisions (``(wire key, Decision)``) into ``index``."""
    for _wire_key, d in decisions:
        index.put(("tenant", d.tenant, None, None, None), active_of(d))


def _subject(key: Key) -> str:
    """The account digest of a decision key, else its source (source scope)."""
    return key[2] or key[3] or key[1]
