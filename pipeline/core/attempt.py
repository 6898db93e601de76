"""The normalised attempt: what the core counts, derived once from a wire LoginAttempt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pipeline.contracts.models import LoginAttempt, datetime_to_ms
from pipeline.core.errors import InvalidAttempt
from pipeline.core.keys import NONE, Digester
from pipeline.core.normalise import SourceRules, normalise_account

PASSWORD_FLOWS = frozenset({"login", "token", "recovery"})


def valid_tenant(tenant: str) -> bool:
    """A tenant that can appear in a decision key: ``|`` separates the key's parts and a
    lone ``-`` means "none", so either would make ``parse_key`` fail on the gateway."""
    return bool(tenant) and tenant != NONE and "|" not in tenant


class Attempt(NamedTuple):
    """One attempt after normalisation: digests instead of identifiers, epoch-ms time.

    ``trusted`` is true only when a device id is present and the login service said it is
    trusted for this account. ``device`` and ``session`` are keyed digests.

    A NamedTuple, not a frozen dataclass: both are immutable, but a frozen dataclass
    sets each field through ``object.__setattr__`` (about 6 us per attempt here, and the
    stages build one per event from its row), a tuple is built in one step.
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
            and self.failure_reason != "refused"
        )

    def to_row(self) -> list[object]:
        """Compact positional form for internal topics and changelogs."""
        return list(self)

    @classmethod
    def from_row(cls, row: list[object]) -> Attempt:
        return cls(*row)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Normaliser:
    """Frozen config that turns wire attempts into core attempts (shared with the edge)."""

    digester: Digester
    sources: SourceRules
    case_sensitive_tenants: frozenset[str] = frozenset()

    def account_digest(self, tenant: str, account: str) -> str:
        normalised = normalise_account(
            account, case_sensitive=tenant in self.case_sensitive_tenants
        )
        return self.digester.account(tenant, normalised)

    def normalise(self, event: LoginAttempt) -> Attempt:
        """Raises InvalidAttempt (bad peer_ip, empty account, bad tenant) for the dead-letter
        topic."""
        tenant = event.tenant
        if not valid_tenant(tenant):
            raise InvalidAttempt(
                "bad_tenant", f"tenant {tenant[:64]!r} contains '|' or is '-' (key syntax)"
            )
        device = self.digester.device(tenant, event.device_id) if event.device_id else None
        session = self.digester.session(tenant, event.session_id) if event.session_id else None
        return Attempt(
            event_id=event.event_id,
            occurred_ms=datetime_to_ms(event.occurred_at),
            tenant=tenant,
            account=self.account_digest(tenant, event.account),
            source=self.sources.source_of(event.peer_ip, event.forwarded_for),
            device=device,
            session=session,
            trusted=bool(event.device_trusted and device is not None),
            flow=event.flow,
            success=event.outcome == "success",
            failure_reason=event.failure_reason,
        )
