"""The throttle policy: a frozen, versioned config object built from TOML text.

Every number is configurable per tenant: ``[tenants.<name>]`` tables are merged over
``[defaults]`` key by key. Every enforcing rule has ``mode = "enforce" | "observe"``;
observe-mode decisions are published with ``action = "observe"`` and never refuse.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.contracts.models import TENANT_RULE, ChallengeKind, valid_tenant
from pipeline.core.errors import PolicyError
from pipeline.core.normalise import NetworkSet, parse_network

Mode = Literal["enforce", "observe"]
MINUTE_MS = 60_000
WINDOW_MS = 15 * MINUTE_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
MAX_WINDOW_MS = 7 * 24 * HOUR_MS
MAX_BLOCK_MS = 366 * 24 * HOUR_MS
"""Longest block: keeps ``expires_at`` a representable timestamp whatever the config says."""
UNTIL_SUCCESS_MS = 100 * 365 * 24 * HOUR_MS
"""How long a hold "until a success" is published for: a century, far past any account
and still inside ClickHouse's DateTime64 (2299)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleConfig(_Frozen):
    """A sliding-window threshold: ``threshold`` events within ``window_ms`` trip the rule."""

    threshold: int = Field(ge=1, le=1_000_000)
    window_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_WINDOW_MS)
    mode: Mode = "enforce"


class BackoffConfig(_Frozen):
    """Block length after the k-th consecutive trip: ``min(cap_ms, base_ms * 2**(k-1))``."""

    base_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_BLOCK_MS)
    cap_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> BackoffConfig:
        if self.cap_ms < self.base_ms:
            raise ValueError("backoff.cap_ms must be >= backoff.base_ms")
        return self

    def block_ms(self, trips: int) -> int:
        """The block length for the ``trips``-th consecutive trip (1-based), capped."""
        if trips <= 1:
            return min(self.cap_ms, self.base_ms)
        # base >= 1, so shifting by cap's bit length already exceeds the cap: clamping the
        # shift there keeps huge streaks cheap and still exact (the old clamp at 40 bits
        # returned less than the cap for caps above base * 2**40).
        return min(self.cap_ms, self.base_ms << min(trips - 1, self.cap_ms.bit_length()))


class LifetimeConfig(_Frozen):
    """NIST 800-63B: this many consecutive failures with no success raise ``lifetime_bound``
    (rule 7's alert counts every flow's failures), and this many consecutive untrusted
    password failures (the lockout's count) refuse untrusted password attempts until a
    success or a reset proven through the mailbox (``block_ms = 0``,
    the default: seed 004's SHALL is "disable"; the decision is published as held for
    ``UNTIL_SUCCESS_MS``, within what ClickHouse's DateTime64 stores), or for ``block_ms``
    when set.

    ``memory_ms`` is how long rule 7's streak survives a quiet account; 0 (the default)
    never forgets: memory is bounded by ``entry_cap``, not by time.
    """

    threshold: int = Field(100, ge=1)
    block_ms: int = Field(0, ge=0, le=MAX_BLOCK_MS)
    memory_ms: int = Field(0, ge=0, le=MAX_BLOCK_MS)

    @field_validator("block_ms")
    @classmethod
    def _zero_or_a_second(cls, value: int) -> int:
        if 0 < value < 1000:
            raise ValueError("lifetime.block_ms must be 0 (until a success) or >= 1000")
        return value

    mode: Mode = "enforce"


class LockoutConfig(_Frozen):
    """Seed 002's consecutive-failure lock on an account, against the untrusted world.

    After ``n >= threshold`` consecutive untrusted password failures (login, token,
    recovery; a success clears ``n``; nothing decays) untrusted password attempts are
    refused for ``min(cap_ms, base_ms * 2**(n // step - 1))``.

    A success from an untrusted client clears ``n`` and lifts the lock. A success from a
    device trusted for the account (never refused by the lock) clears it only when
    ``trusted_success_clears`` is true, or when the lifetime bound holds the account:
    otherwise every sign-in of the owner would hand the stranger ``threshold`` fresh
    guesses (measured: 1,391 of 10,000 stranger guesses through against an owner who
    signs in every 3 minutes for 14 h, against 25 with the default).

    ``in_flight_ms`` is the decision latency the lock allows for (event time, from the
    moment a lock comes into force): a failure inside it that the gateway did not report
    ``refused`` passed the gateway's check while the decision was in flight, a real
    guess, and is counted (the run and the lifetime bound); a later unreported failure
    inside the lock is taken as refused by a gateway that does not report refusals.
    """

    threshold: int = Field(5, ge=1, le=1_000_000)
    base_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_BLOCK_MS)
    step: int = Field(5, ge=1, le=1_000_000)
    cap_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)
    trusted_success_clears: bool = False
    in_flight_ms: int = Field(2000, ge=0, le=MAX_BLOCK_MS)
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> LockoutConfig:
        if self.cap_ms < self.base_ms:
            raise ValueError("lockout.cap_ms must be >= lockout.base_ms")
        return self


class MfaCurveConfig(_Frozen):
    """Seed 004's second-factor curve: after the n-th consecutive failure per (account,
    device or session) the next attempt waits ``min(cap_ms, factor_ms * 2**(n-1))``; a
    success resets n; nothing decays. ``enabled = false`` falls back to the ``mfa``
    window rule."""

    enabled: bool = True
    factor_ms: int = Field(1000, ge=1, le=MAX_BLOCK_MS)
    cap_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)
    mode: Mode = "enforce"


class NoticeConfig(_Frozen):
    """Seed 001's unlock mail: at most one notice per account per ``window_ms`` when an
    untrusted lock on it trips (consecutive lock, ceiling, lifetime bound)."""

    enabled: bool = True
    window_ms: int = Field(24 * HOUR_MS, ge=1000, le=MAX_BLOCK_MS)


REMOVED_STUFFING_KEYS = (
    "block_min_unknown",
    "block_more_unknown",
    "block_lower_ratio",
    "success_factor",
    "block_ms",
    "mode",
)
"""The per-source stuffing block's settings, removed (issue 24): it refused people who
tried several identifiers and answered whether accounts exist."""


class StuffingConfig(_Frozen):
    """Credential stuffing: signals, never a block on their own.

    The ``credential_stuffing`` alert is raised once per ``window_ms`` for a source with
    at least ``min_attempts`` untrusted failures of which at least ``unknown_ratio`` are
    distinct accounts that do not exist (an alert reaches operators, never a client, so
    it is no existence oracle).

    The wave across sources: ``stuffing_tenant`` is raised once per tumbling
    ``tenant_window_ms`` when the tenant's distinct unknown accounts (untrusted failures,
    summed over sources) reach ``max(tenant_min_unknown, tenant_factor * baseline)``,
    the baseline being the mean of the previous ``tenant_baseline_windows`` windows (a
    window that fired counts at its own baseline, so one wave does not mask the next). An
    alert for operators: it counts whether accounts exist, so it never starts a decision
    a client sees (the wave challenge follows rule 8's existence-blind count).
    """

    min_attempts: int = Field(50, ge=1)
    unknown_ratio: float = Field(0.8, gt=0.0, le=1.0)
    window_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_WINDOW_MS)
    tenant_window_ms: int = Field(MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    tenant_min_unknown: int = Field(20, ge=1)
    tenant_factor: float = Field(5.0, ge=1.0)
    tenant_baseline_windows: int = Field(15, ge=1, le=1440)

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            removed = sorted(set(data) & set(REMOVED_STUFFING_KEYS))
            if removed:
                raise ValueError(
                    f"{', '.join(removed)}: removed with the per-source stuffing block; a "
                    "stuffing wave is answered by the tenant's challenge ([wave], "
                    "docs/policy.md): delete these keys"
                )
        return data


class WaveConfig(_Frozen):
    """A tenant under a wave challenges its untrusted password attempts.

    When ``spray_tenant`` (rule 8: distinct failing accounts, existence-blind) fires, the
    rollup publishes a decision on
    the tenant's key (``tenant|t|-|-|-``, action ``challenge``) demanding ``challenge``
    of untrusted password attempts for ``hold_ms`` after the firing; each firing of the
    same wave extends it, so it ends ``hold_ms`` after the wave's last firing. A device
    trusted for the account is never challenged by it, nor an account at a source it
    succeeded from before (``FamiliarConfig``). ``mode = "observe"`` publishes it as
    ``observe`` (it demands nothing).

    The wave's **lead-in**: the decision's ``window_ms`` reaches back ``lead_in_ms``
    before the end of the wave's first firing window, so its evidence began at
    ``issued_at - window_ms``. A session signed in since then from an untrusted client
    without a challenge, at no pair or client familiar before then, is asked a step-up
    while the wave holds (``pipeline.core.decisions.review_session``, the edge's
    ``/v1/session``): the credentials a wave tried before it was detected. 0 turns the
    review off."""

    enabled: bool = True
    challenge: ChallengeKind = "captcha"
    hold_ms: int = Field(MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    lead_in_ms: int = Field(MINUTE_MS, ge=0, le=MAX_WINDOW_MS)
    mode: Mode = "enforce"


class FamiliarConfig(_Frozen):
    """Sources an account succeeded from: its owner's own places.

    A success of an account (any password flow, or a reset proven through the mailbox)
    publishes ``familiar|t|a|s|-`` (action ``exempt``) for ``memory_ms``, renewed at most
    once per ``renew_ms``: that pair is never challenged by the tenant's wave, nor refused
    or challenged by a rule-issued source decision. A source with at least
    ``shared_accounts`` familiar accounts within a renew period is shared by real users
    (a NAT, a library): no rule blocks it on a stranger's evidence.

    An account makes at most ``new_per_day`` new places and clients familiar per UTC day
    of event time (renewals of known ones are not counted; 0: no limit): an attacker
    signing in to an account of its own from every exit of a proxy pool would otherwise
    fill the ``entry_cap``-bounded tables and evict the owners' places, and with them
    their exemptions. A success past the quota is a success like any other; only its
    place or client is not published (``authpipe_familiar_quota_reached``). The familiar
    tables have their own cap, ``entry_cap`` (1,000,000 per tenant): a tenant's people
    make places familiar faster than the other tables fill (phones on carrier NATs sign in
    from a new address every few logins), and an entry evicted at the cap is an owner who
    is challenged in the next wave."""

    enabled: bool = True
    memory_ms: int = Field(30 * DAY_MS, ge=1000, le=MAX_BLOCK_MS)
    renew_ms: int = Field(DAY_MS, ge=1000, le=MAX_BLOCK_MS)
    shared_accounts: int = Field(3, ge=1, le=1_000_000)
    new_per_day: int = Field(20, ge=0, le=1_000_000)
    entry_cap: int = Field(1_000_000, ge=10, le=100_000_000)
    """Entries per ``familiar`` table and tenant (the tenant's ``entry_cap`` bounds the
    others): successes, not attackers' identifiers, fill it (``new_per_day`` bounds what
    one account adds), and an owner evicted from it loses the exemption."""

    @model_validator(mode="after")
    def _renew_within_memory(self) -> FamiliarConfig:
        if self.renew_ms > self.memory_ms:
            raise ValueError("familiar.renew_ms must be <= familiar.memory_ms")
        return self


class ChallengeFailuresConfig(_Frozen):
    """Bot evidence: a source that fails ``threshold`` challenges (``flow = "challenge"``,
    outcome failure) within ``window_ms`` is blocked for its untrusted password attempts
    for ``block_ms`` (rule ``challenge_failures``, scope ``source``), unless it is shared
    by real users (``FamiliarConfig.shared_accounts``). Failing a challenge says nothing
    about whether an account exists."""

    threshold: int = Field(5, ge=1, le=1_000_000)
    window_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_WINDOW_MS)
    block_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)
    mode: Mode = "enforce"


class MfaAccountConfig(_Frozen):
    """NIST SP 800-63B's bound for one-time codes, per account: ``threshold`` consecutive
    ``mfa`` failures of the account over every device, cookie and session refuse its
    second-factor checks (key ``mfa|t|a|-|-``) until a success of the second factor,
    a reset proven through the mailbox, or ``lifetime.block_ms``."""

    threshold: int = Field(100, ge=1, le=1_000_000)
    mode: Mode = "enforce"


class TenantSprayConfig(_Frozen):
    """Distinct failing accounts in a tenant per tumbling window, against its trailing baseline.

    Fires when ``distinct >= max(min_accounts, factor * baseline)`` and at least
    ``min_sources`` sources failed, where ``baseline`` is the ``baseline_quantile`` of the
    previous ``baseline_windows`` windows seen that did not fire (a low quantile, not the
    mean: a wave, or a spray from too few sources to fire, does not raise it while it
    lasts, so one wave does not mask the next; when every window of the last hour fired,
    all of them are the sample, so a lasting change of the norm is a wave for an hour at
    most). ``min_history_windows`` keeps it quiet until the rollup
    has seen that many earlier windows of the tenant: with no history the baseline is 0
    and a busy tenant's ordinary typos pass ``min_accounts``. Short windows (10 s) answer
    a wave within seconds. A paced wave (a spray from hundreds of addresses at a couple of
    attempts a second) fires on the sum of the last ``slow_windows`` windows when it
    reaches ``max(min_accounts, slow_min_accounts, slow_factor * slow_windows * baseline)``
    from at least ``min_sources`` sources (``slow_windows = 1`` turns that off). ``spray_tenant`` is
    alerted when a wave starts (the window before did not fire), and every firing window
    extends the wave challenge.
    Existence-blind: unknown and real accounts count alike. Only unfamiliar failures
    count: an untrusted failure of an account at a source it succeeded from within
    ``familiar.memory_ms`` is its owner's typo, not a wave's, unless ``count_familiar``
    (an attacker cannot make its own address familiar for an account without that
    account's password, so this does not depend on which accounts exist). An account
    counts when it fails with no unfamiliar failure in the ``recount_ms`` before: an app
    retrying a stale password every minute for twenty minutes counts once, where a spray or a
    stuffing list touches each account once and counts every one (0 counts every window).
    """

    window_ms: int = Field(10_000, ge=1000, le=MAX_WINDOW_MS)
    baseline_windows: int = Field(360, ge=1, le=1440)
    baseline_quantile: float = Field(0.1, ge=0.0, le=1.0)
    factor: float = Field(3.0, ge=1.0)
    min_accounts: int = Field(20, ge=1)
    min_sources: int = Field(10, ge=1)
    min_history_windows: int = Field(6, ge=0, le=1440)
    slow_windows: int = Field(6, ge=1, le=1440)
    slow_factor: float = Field(2.0, ge=1.0)
    slow_min_accounts: int = Field(40, ge=1)
    recount_ms: int = Field(
        5 * MINUTE_MS,
        ge=0,
        le=MAX_WINDOW_MS,
        description="an account failing again sooner than this after its last failure counts once",
    )
    count_familiar: bool = Field(
        False, description="count failures of an account at a source it succeeded from"
    )


class StrangersConfig(_Frozen):
    """The wave's slow tier: strangers' failures nobody then signs in from.

    A stuffer who paces a proxy pool under rule 8 (each exit used once, fewer than
    ``min_accounts`` accounts in 10 s and ``slow_min_accounts`` a minute) looks like
    typos to every per-window count. What it cannot fake is what follows a real
    person's failure at a new place: a sign-in from there. The source stage counts a
    source once per ``redeem_ms`` span when an untrusted password attempt fails there
    (or a challenge does) and the source is a stranger's place: not a known place (no
    account succeeded there within ``familiar.memory_ms``), the account had not succeeded
    there or with that client (``FamiliarConfig``), and the account had no unfamiliar
    failure in ``tenant_spray.recount_ms`` (one account brute-forced from a thousand
    addresses is the lock's, counted once). It is **redeemed** when,
    within ``redeem_ms`` of that failure, the account that failed signs in from there or
    some account's success makes the place familiar (a new pair within its account's
    ``familiar.new_per_day``, or a renewal): the person who mistyped an old e-mail and
    then signed in with the right one, the patron of a library. A proxy exit used once
    is never redeemed but by the few valid credentials it tried; an attacker's own
    account redeems at most ``new_per_day`` exits a day.

    The rollup sums, per tenant and rule-8 window, the sources counted less those
    redeemed, once a window is ``redeem_ms`` old (settled), and fires when the last
    ``span_ms`` of settled windows reach ``max(min_sources, factor x baseline)``, where
    ``baseline`` is the ``tenant_spray.baseline_quantile`` of the same sums ending at the
    last ``tenant_spray.baseline_windows`` settled windows that did not fire (sums: most
    windows hold none, and only a sum shows a steady level such as a cold start's),
    looked for as far back as ``max_wave_ms`` (a patient attack does not become the norm
    after an hour, as rule 8's would; a lasting change of the norm is a wave for
    ``max_wave_ms`` at most), and while the last
    ``active_ms`` of settled windows keep that threshold's pace (at least ``min_sources x
    active_ms / span_ms``, 4 a minute by default: the attack goes on; the wave ends about
    ``redeem_ms + active_ms`` after its last stranger's failure, not when the attack has
    left the span, and neither a straggler nor a cold tenant's own noise stretches it). It does not fire
    before it has seen ``min_history_ms`` of the tenant (a cold start learns the norm
    first). A firing raises the tenant's wave challenge (``WaveConfig``; the decision's
    rule is ``strangers_tenant``) and, when the window before did not fire, the alert
    ``strangers_tenant``; the wave's lead-in reaches back ``lead_in_ms`` before the end
    of the first settled window that fired, which covers the ``redeem_ms`` the tier
    waits. Existence-blind: the account's existence plays no part, only where failures
    came from and whether anybody signed in there."""

    enabled: bool = True
    redeem_ms: int = Field(5 * MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    span_ms: int = Field(10 * MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    min_sources: int = Field(40, ge=1, le=1_000_000)
    factor: float = Field(3.0, ge=1.0)
    active_ms: int = Field(MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    max_wave_ms: int = Field(24 * HOUR_MS, ge=MINUTE_MS, le=MAX_WINDOW_MS)
    min_history_ms: int = Field(HOUR_MS, ge=0, le=MAX_WINDOW_MS)
    lead_in_ms: int = Field(5 * MINUTE_MS, ge=0, le=MAX_WINDOW_MS)

    @model_validator(mode="after")
    def _active_within_span(self) -> StrangersConfig:
        if self.active_ms > self.span_ms:
            raise ValueError("strangers.active_ms must be <= strangers.span_ms")
        return self


class TenantPolicy(_Frozen):
    """The rules of one tenant (or the defaults every tenant starts from)."""

    account_source: RuleConfig = RuleConfig(threshold=5)
    account: RuleConfig = RuleConfig(threshold=50)
    device: RuleConfig = RuleConfig(threshold=10)
    uia: RuleConfig = RuleConfig(threshold=5)
    mfa: RuleConfig = RuleConfig(threshold=5)
    source: RuleConfig = RuleConfig(threshold=200, mode="observe")
    backoff: BackoffConfig = BackoffConfig()
    lifetime: LifetimeConfig = LifetimeConfig()
    lockout: LockoutConfig = LockoutConfig()
    mfa_curve: MfaCurveConfig = MfaCurveConfig()
    notice: NoticeConfig = NoticeConfig()
    stuffing: StuffingConfig = StuffingConfig()
    tenant_spray: TenantSprayConfig = TenantSprayConfig()
    wave: WaveConfig = WaveConfig()
    strangers: StrangersConfig = StrangersConfig()
    familiar: FamiliarConfig = FamiliarConfig()
    challenge_failures: ChallengeFailuresConfig = ChallengeFailuresConfig()
    mfa_account: MfaAccountConfig = MfaAccountConfig()
    allowlist: tuple[str, ...] = Field((), description="CIDRs exempt from the source signal")
    case_sensitive: bool = False
    trusted_devices_per_account: int = Field(
        5, ge=1, le=1_000_000, description="distinct trusted devices failing per device window"
    )
    sub_buckets: int = Field(15, ge=1, le=240, description="sliding-window resolution")
    entry_cap: int = Field(100_000, ge=10, description="entries per table for this tenant")
    streak_memory_ms: int = Field(
        24 * HOUR_MS, ge=0, le=MAX_BLOCK_MS, description="escalation level kept this long"
    )

    @field_validator("allowlist")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            parse_network(cidr)
        return value

    @cached_property
    def allowlist_set(self) -> NetworkSet:
        return NetworkSet(self.allowlist)


class Policy(_Frozen):
    """A versioned policy: defaults plus per-tenant overrides."""

    model_config = ConfigDict(frozen=True, extra="forbid", ignored_types=(cached_property,))

    policy_version: str = Field("default-1", min_length=1, max_length=64)
    defaults: TenantPolicy = TenantPolicy()
    tenants: Mapping[str, TenantPolicy] = Field(default_factory=dict)

    def for_tenant(self, tenant: str) -> TenantPolicy:
        """The tenant's rules, or the defaults for a tenant without overrides."""
        return self.tenants.get(tenant, self.defaults)

    def case_sensitive_tenants(self) -> frozenset[str]:
        """Tenants whose policy says ``case_sensitive = true`` (for the Normaliser, which
        takes the set: the policy's flag only takes effect through it). With the flag in
        ``[defaults]`` every tenant is case-sensitive, which a set cannot say; then the
        caller must list the tenants in its settings."""
        return frozenset(name for name, rules in self.tenants.items() if rules.case_sensitive)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


_BUILTIN = TenantPolicy().model_dump()


def policy_from_mapping(document: Mapping[str, Any]) -> Policy:
    """Build a policy from a parsed document; tenant tables are merged over the defaults."""
    unknown = set(document) - {"policy_version", "defaults", "tenants"}
    if unknown:
        raise PolicyError(
            f"unknown top-level policy keys {sorted(unknown)}; "
            "expected policy_version, [defaults] and [tenants.<name>]"
        )
    defaults = document.get("defaults", {})
    tenants_doc = document.get("tenants", {})
    if not isinstance(defaults, Mapping) or not isinstance(tenants_doc, Mapping):
        raise PolicyError("invalid policy: [defaults] and [tenants] must be tables")
    try:
        # [defaults] is merged over the built-in defaults key by key, like tenants over
        # it: a table that sets only ``source.threshold`` must keep the built-in
        # ``mode = "observe"`` (RuleConfig's own default is "enforce"), and one that sets
        # only a mode must not fail for want of a threshold.
        base = TenantPolicy.model_validate(_merge(_BUILTIN, defaults)).model_dump()
    except (ValidationError, ValueError) as exc:
        raise PolicyError(f"invalid policy: [defaults]: {_one_line(exc)}") from exc
    tenants: dict[str, TenantPolicy] = {}
    for name, override in tenants_doc.items():
        if not isinstance(override, Mapping):
            raise PolicyError(f"invalid policy: [tenants.{name}] must be a table")
        if not valid_tenant(name):
            raise PolicyError(f"invalid policy: [tenants.{name!r}]: {TENANT_RULE}")
        try:
            tenants[name] = TenantPolicy.model_validate(_merge(base, override))
        except (ValidationError, ValueError) as exc:
            # Name the tenant: pydantic's message names only the field inside it.
            raise PolicyError(f"invalid policy: [tenants.{name}]: {_one_line(exc)}") from exc
    try:
        return Policy(
            policy_version=document.get("policy_version", "default-1"),
            defaults=TenantPolicy.model_validate(base),
            tenants=tenants,
        )
    except (ValidationError, ValueError) as exc:
        raise PolicyError(f"invalid policy: {_one_line(exc)}") from exc


def _one_line(exc: ValueError) -> str:
    """A validation problem as one line: ``field.path: what is wrong`` per problem, no URLs."""
    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    problems = []
    for err in exc.errors():
        where = ".".join(str(part) for part in err["loc"]) or "value"
        if err["type"] == "extra_forbidden":
            what = "unknown key (schemas/policy.example.toml lists every field)"
        else:
            what = " ".join(str(err["msg"]).split())
        problems.append(f"{where}: {what}")
    return "; ".join(problems)


def policy_from_toml(text: str) -> Policy:
    """Parse TOML text into a Policy; raises PolicyError with the parser's message."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy is not valid TOML: {exc}") from exc
    return policy_from_mapping(document)


DEFAULT_POLICY = Policy()
