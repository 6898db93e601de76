"""The normalised attempt: what the core counts, derived once from a decoded login_attempt."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pipeline.contracts.models import TENANT_RULE, AttemptInput, datetime_to_ms, valid_tenant
from pipeline.core.errors import InvalidAttempt
from pipeline.core.keys import Digester
from pipeline.core.normalise import SourceRules, normalise_account

PASSWORD_FLOWS = frozenset({"login", "token", "recovery"})
FAMILIAR = "familiar"
"""The ``failure_reason`` of an attempt the account stage forwards at the account's own
familiar place or client: a success that made it familiar, or a failure there (the
source stage's ``StrangersConfig`` does not count it)."""
REPEAT = "repeat"
REPEAT_UNKNOWN = "repeat_unknown"
"""The ``failure_reason`` of an unfamiliar failure the account stage forwards when rule 8
did not count its account again (it failed within ``recount_ms``): the source stage
counts it for spray and (``REPEAT_UNKNOWN``) the stuffing alert's unknown accounts, not
as a stranger's new failure."""
STEP_UP = "step_up"
"""The ``failure_reason`` of an attempt reported ``outcome = "step_up"``: a right password
the login service answered with a possession check. Like ``refused``, it is counted in no
rule, ends no lock run and makes nothing familiar (issue 44): only the completed sign-in,
a later ``success``, does."""
UNCOUNTED = frozenset({"refused", STEP_UP})
"""``failure_reason`` values of attempts that no rule counts (audited only)."""
RECENT_ENTRIES = 32_768  # per generation of each Normaliser cache; two generations at most


class Attempt(NamedTuple):
    """One attempt after normalisation: digests instead of identifiers, epoch-ms time.

    ``trusted`` is true only when a device id is present and the login service said it is
    trusted for this account. ``device`` and ``session`` are keyed digests.

    A NamedTuple, not a frozen dataclass: both are immutable, but a frozen dataclass
    sets each field through ``object.__setattr__`` and the stages build one per event
    from its row; a tuple is built in one step (bench/README.md).
    """

    event_id: str
    occurred_ms: int
    tenant: str
    account: str
    source: str
    device: str | None
    session: str | None
    trusted: bool
    flow: str
    success: bool
    failure_reason: str | None

    @property
    def password_flow(self) -> bool:
        return self.flow in PASSWORD_FLOWS

    @property
    def untrusted_password_failure(self) -> bool:
        return (
            not self.success
            and not self.trusted
            and self.flow in PASSWORD_FLOWS
            and self.failure_reason not in UNCOUNTED
        )

    def to_row(self) -> list[object]:
        """Compact positional form for internal topics and changelogs."""
        return list(self)

    @classmethod
    def from_row(cls, row: list[object]) -> Attempt:
        return cls(*row)  # type: ignore[arg-type]


class Recent:
    """The results of recent calls, at most ``2 * entries`` of them (two generations).

    When the young generation is full it becomes the old one and the old one is dropped;
    a hit in the old generation moves back to the young one. Memory stays bounded however
    many distinct identifiers attackers send, and whatever repeats stays cheap."""

    def __init__(self, entries: int = RECENT_ENTRIES) -> None:
        self.entries = entries
        self.young: dict[Any, str] = {}
        self.old: dict[Any, str] = {}

    def get(self, key: Any) -> str | None:
        value = self.young.get(key)
        if value is None:
            value = self.old.get(key)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: Any, value: str) -> None:
        if len(self.young) >= self.entries:
            self.old = self.young
            self.young = {}
        self.young[key] = value

    def __len__(self) -> int:
        return len(self.young) + len(self.old)


@dataclass(frozen=True, slots=True)
class Normaliser:
    """Frozen config that turns wire attempts into core attempts (shared with the edge).

    Normalising an identifier costs a keyed BLAKE2b digest, NFKC folding or an address
    parse, and users, NATs and attackers repeat: the account digest,
    the source and the device digest of recent identifiers are remembered separately
    (``Recent``), so an attempt pays only for the identifiers it is the first to send.
    Errors are never cached: a bad address is parsed, and refused, every time."""

    digester: Digester
    sources: SourceRules
    case_sensitive_tenants: frozenset[str] = frozenset()
    recent_accounts: Recent = field(default_factory=Recent, init=False, repr=False, compare=False)
    recent_sources: Recent = field(default_factory=Recent, init=False, repr=False, compare=False)
    recent_devices: Recent = field(default_factory=Recent, init=False, repr=False, compare=False)

    def account_digest(self, tenant: str, account: str) -> str:
        normalised = normalise_account(
            account, case_sensitive=tenant in self.case_sensitive_tenants
        )
        return self.digester.account(tenant, normalised)

    def normalise(self, event: AttemptInput) -> Attempt:
        """Raises InvalidAttempt (bad peer_ip, empty account, bad tenant) for the dead-letter
        topic."""
        tenant = event.tenant
        if not valid_tenant(tenant):
            raise InvalidAttempt("bad_tenant", f"{TENANT_RULE}; got {tenant[:64]!r}")
        device = self._device(tenant, event.device_id) if event.device_id else None
        session = self.digester.session(tenant, event.session_id) if event.session_id else None
        return Attempt(
            event.event_id,
            datetime_to_ms(event.occurred_at),
            tenant,
            self._account(tenant, event.account),
            self._source(event.peer_ip, event.forwarded_for),
            device,
            session,
            bool(event.device_trusted and device is not None),
            event.flow,
            event.outcome == "success",
            STEP_UP if event.outcome == STEP_UP else event.failure_reason,
        )

    def _account(self, tenant: str, account: str) -> str:
        key = (tenant, account)
        digest = self.recent_accounts.get(key)
        if digest is None:
            digest = self.account_digest(tenant, account)
            self.recent_accounts.put(key, digest)
        return digest

    def _source(self, peer_ip: str, forwarded_for: tuple[str, ...]) -> str:
        key = (peer_ip, forwarded_for)
        source = self.recent_sources.get(key)
        if source is None:
            source = self.sources.source_of(peer_ip, forwarded_for)  # raises: not cached
            self.recent_sources.put(key, source)
        return source

    def _device(self, tenant: str, device_id: str) -> str:
        key = (tenant, device_id)
        digest = self.recent_devices.get(key)
        if digest is None:
            digest = self.digester.device(tenant, device_id)
            self.recent_devices.put(key, digest)
        return digest


def audit_outcome(attempt: Attempt) -> str:
    """The contract's ``outcome`` of a normalised attempt (``success``, ``failure`` or
    ``step_up``), as the audit row reports it."""
    if attempt.success:
        return "success"
    return STEP_UP if attempt.failure_reason == STEP_UP else "failure"


def repeat_of(attempt: Attempt) -> str:
    """The forwarded ``failure_reason`` of a repeated unfamiliar failure (``REPEAT``)."""
    return REPEAT_UNKNOWN if attempt.failure_reason == "unknown_account" else REPEAT
