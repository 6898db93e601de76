"""Pydantic wire models. Inputs ignore unknown fields; outputs forbid them; all are frozen.

Timestamps on the wire are RFC 3339. Inputs must carry an offset; outputs are always
UTC with millisecond precision and a ``Z`` suffix (``2026-11-29T22:45:09.123Z``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PlainSerializer, field_validator

SCHEMA_VERSION = 1
USER_AGENT_MAX_CHARS = 512
TENANT_PATTERN = r"[a-z0-9][a-z0-9._-]{0,63}"
TENANT_RULE = (
    f"tenant must match {TENANT_PATTERN}: 1 to 64 lower-case letters, digits, '.', '_' or "
    "'-', starting with a letter or digit"
)
_TENANT = re.compile(TENANT_PATTERN)


def valid_tenant(tenant: object) -> bool:
    """The one tenant validator (ingest, the edge, settings): ``TENANT_PATTERN`` in full.

    A tenant ends up in decision keys (``|``-separated, ``-`` meaning none), in nginx
    feed headers and in Grafana's ``tenant IN (${tenant:singlequote})``: no quote,
    backslash, separator or control character can pass."""
    return isinstance(tenant, str) and _TENANT.fullmatch(tenant) is not None


Flow = Literal["login", "uia", "mfa", "recovery", "token", "reset", "challenge"]
"""``reset``: a password reset completed through a link mailed to the account's own
address (proof of mailbox control, like seed 001's unlock link); never refused by the
lock, the ceiling or the lifetime bound, and a success ends the consecutive run.
``recovery`` stays the flow of guessable recovery secrets (security answers, SMS codes),
which count like passwords. ``challenge``: the outcome of a challenge the edge demanded
(``challenge`` names its kind)."""
ChallengeKind = Literal["captcha", "step_up"]
"""``captcha``: proof of a human before the password is checked; ``step_up``: a second
factor or e-mail code after a correct password from an untrusted client."""
Outcome = Literal["success", "failure", "step_up"]
"""``success``: the attempt opened a session (for a password flow, the completed sign-in:
after the step-up, if one was asked; such a success carries ``challenge = "step_up"``);
``failure``: it did not; ``step_up``: the password was right and the login service answered
it with a possession check (a second factor or an e-mailed code) before any session. A
``step_up`` counts in no rule and ends no lock run, makes nothing familiar: only the
completed sign-in does (issue 44). The possession check itself is reported as
``flow = "mfa"``."""
FailureReason = Literal["bad_password", "unknown_account", "bad_second_factor", "refused", "other"]
Scope = Literal[
    "account_source",
    "account",
    "device",
    "uia",
    "mfa",
    "source",
    "lock",
    "tenant",
    "familiar",
    "passed",
]
"""A decision's scope, its key's first part. ``passed``: a client passed a CAPTCHA for the
account (action ``exempt``: no CAPTCHA again for that account and client for
``[wave] captcha_pass_ms``; never a refusal or a step-up lifted)."""
NoticeReason = Literal["consecutive_lock", "account_ceiling", "lifetime_bound"]
AppliesTo = Literal["untrusted", "device", "uia", "mfa", "all"]
Action = Literal["block", "observe", "challenge", "exempt"]
"""``challenge``: demand ``Decision.challenge`` instead of refusing; ``exempt``: the
account is familiar at the source (``scope = "familiar"``), which lifts wave challenges
and rule-issued source decisions for that pair."""
AppliedDecision = Literal["allowed", "block", "observe", "challenge"]


def format_utc_ms(value: datetime) -> str:
    """RFC 3339, UTC, millisecond precision, ``Z`` suffix."""
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def ms_to_datetime(epoch_ms: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime."""
    return _EPOCH + timedelta(milliseconds=epoch_ms)


def datetime_to_ms(value: datetime) -> int:
    """An aware datetime as epoch milliseconds (floor)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def parse_utc_ms(text: str) -> int:
    """An RFC 3339 time with a UTC offset as epoch milliseconds (floor); raises ValueError
    (saying what is wrong) for other text or a time without an offset."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ValueError(f"{text[:40]!r} has no UTC offset")
    return datetime_to_ms(moment)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

UtcMs = Annotated[AwareDatetime, PlainSerializer(format_utc_ms, return_type=str, when_used="json")]


class _Input(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)


class _Output(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class LoginAttempt(_Input):
    """One authentication attempt, schema ``login_attempt`` version 1 (topic auth.login-attempts).

    Unknown extra fields are accepted and ignored: producers may be newer than we are.
    ``peer_ip`` is checked to be an IP address by normalisation, which parses it anyway;
    ``forwarded_for`` entries are free text because garbage there is skipped entry by entry.
    """

    event_id: str = Field(min_length=1, max_length=128, description="unique per attempt")
    occurred_at: AwareDatetime = Field(description="event time, RFC 3339 with offset")
    tenant: str = Field(
        "default",
        min_length=1,
        max_length=64,
        description="realm",
        json_schema_extra={"pattern": f"^{TENANT_PATTERN}$"},  # checked by valid_tenant
    )
    service: str = Field(min_length=1, max_length=128, description="emitting login service")
    flow: Flow = Field("login", description="uia = password re-check inside a session")
    account: str = Field(min_length=1, max_length=320, description="identifier as typed")
    peer_ip: str = Field(min_length=2, max_length=64, description="TCP peer, IPv4 or IPv6")
    forwarded_for: tuple[str, ...] = Field(
        (), max_length=64, description="XFF chain, left to right"
    )
    device_id: str | None = Field(
        None, min_length=1, max_length=256, description="device cookie id"
    )
    device_trusted: bool = Field(False, description="cookie verified trusted for this account")
    session_id: str | None = Field(None, min_length=1, max_length=256, description="for uia")
    outcome: Outcome
    failure_reason: FailureReason | None = None
    challenge: ChallengeKind | None = Field(
        None, description="flow challenge: which challenge this event reports the outcome of"
    )
    user_agent: str | None = Field(None, description="cut to 512 characters")

    @field_validator("tenant")
    @classmethod
    def _tenant_syntax(cls, value: str) -> str:
        if not valid_tenant(value):
            raise ValueError(TENANT_RULE)
        return value

    @field_validator("user_agent", mode="before")
    @classmethod
    def _cut_user_agent(cls, value: object) -> object:
        if isinstance(value, str) and len(value) > USER_AGENT_MAX_CHARS:
            return value[:USER_AGENT_MAX_CHARS]
        return value


class AttemptInput(Protocol):
    """A decoded ``login_attempt``, read-only: what ``codec.decode_attempt`` returns (a
    ``LoginAttempt``, or its msgspec twin ``fast_attempt.LoginAttemptStruct`` with the same
    values) and what the normaliser reads."""

    @property
    def event_id(self) -> str: ...
    @property
    def occurred_at(self) -> datetime: ...
    @property
    def tenant(self) -> str: ...
    @property
    def service(self) -> str: ...
    @property
    def flow(self) -> Flow: ...
    @property
    def account(self) -> str: ...
    @property
    def peer_ip(self) -> str: ...
    @property
    def forwarded_for(self) -> tuple[str, ...]: ...
    @property
    def device_id(self) -> str | None: ...
    @property
    def device_trusted(self) -> bool: ...
    @property
    def session_id(self) -> str | None: ...
    @property
    def outcome(self) -> Outcome: ...
    @property
    def failure_reason(self) -> FailureReason | None: ...
    @property
    def challenge(self) -> ChallengeKind | None: ...
    @property
    def user_agent(self) -> str | None: ...


class Decision(_Output):
    """A throttle decision on the compacted topic auth.throttle-decisions.

    The Kafka key is ``key``; a null value with that key (a tombstone) lifts it.
    ``device_id`` is the keyed digest of the device cookie id (or of the session id for
    ``uia``), never the raw id.
    """

    decision_id: str
    key: str
    tenant: str
    scope: Scope
    account_digest: str | None
    source: str | None
    device_id: str | None
    applies_to: AppliesTo
    action: Action
    rule: str
    count: int = Field(ge=0)
    threshold: int = Field(ge=0)
    window_ms: int = Field(ge=0)
    issued_at: UtcMs
    expires_at: UtcMs
    policy_version: str
    # Only operators' decisions (rule ``manual``) carry these; the rules' omit them.
    operator: str | None = Field(
        None,
        max_length=128,
        description="who decided (rule manual)",
        exclude_if=lambda v: v is None,
    )
    reason: str | None = Field(
        None, max_length=512, description="why (rule manual)", exclude_if=lambda v: v is None
    )
    # Only challenges (and their observe-mode twins) carry the kind they demand.
    challenge: ChallengeKind | None = Field(
        None, description="what a challenge decision demands", exclude_if=lambda v: v is None
    )


class Alert(_Output):
    """An alert on auth.alerts, emitted once per subject per window."""

    alert_id: str
    type: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    tenant: str
    source: str | None
    account_digest: str | None
    count: int = Field(ge=0)
    distinct_accounts: int = Field(ge=0)
    window_start: UtcMs
    window_end: UtcMs
    policy_version: str


class AccountNotice(_Output):
    """Seed 001's unlock mail, on auth.account-notices (Kafka key: ``account_digest``).

    Emitted at most once per account per ``[window_start, window_end)`` when an untrusted
    lock on the account trips, so the login service can mail the owner a sign-in link
    that, on success, trusts the device. It carries no plain identifier: the login
    service maps the digest back to its own account.
    """

    notice_id: str
    tenant: str
    account_digest: str
    reason: NoticeReason
    expires_at: UtcMs
    window_start: UtcMs
    window_end: UtcMs
    policy_version: str


class AuditRow(_Output):
    """One row of the audit stream auth.audit, the ClickHouse ``attempts`` table's input.

    ``weight`` is the number of attempts the row stands for: 1 for an ordinary row,
    more for the summary row the rate cap writes when a key's minute closes, so that
    ``sum(weight)`` is exact whatever the cap dropped.
    """

    ts: UtcMs
    tenant: str
    service: str
    flow: Flow
    account_digest: str
    account: str | None = None
    source: str
    device_id: str
    trusted: bool
    outcome: Outcome
    failure_reason: str
    decision: AppliedDecision
    weight: int = Field(ge=1)
    summary: bool = False
    policy_version: str
    event_id: str
    kafka_topic: str
    kafka_partition: int = Field(ge=0)
    kafka_offset: int = Field(ge=0)


# The audit topic carries batches: {"v": 1, "columns": AUDIT_COLUMNS, "rows": [[...], ...]}.
# Each row holds AuditRow's fields in this order, except that ``ts`` is epoch milliseconds
# (``ts_ms``): positional rows cost a fraction of objects to encode and decode.
AUDIT_COLUMNS: tuple[str, ...] = (
    "ts_ms",
    "tenant",
    "service",
    "flow",
    "account_digest",
    "account",
    "source",
    "device_id",
    "trusted",
    "outcome",
    "failure_reason",
    "decision",
    "weight",
    "summary",
    "policy_version",
    "event_id",
    "kafka_topic",
    "kafka_partition",
    "kafka_offset",
)
