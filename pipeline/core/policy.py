"""The throttle policy: a frozen, versioned config object built from TOML text.

Every number is configurable per tenant: ``[tenants.<name>]`` tables are merged over
``[defaults]`` key by key. The sections' models are in ``policy_rules`` (the per-account,
device and source rules) and ``policy_waves`` (the tenant-wide wave detectors).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cached_property
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator

from pipeline.contracts.models import TENANT_RULE, valid_tenant
from pipeline.core.errors import PolicyError
from pipeline.core.normalise import NetworkSet, parse_network
from pipeline.core.policy_rules import (
    HOUR_MS,
    MAX_BLOCK_MS,
    BackoffConfig,
    ChallengeFailuresConfig,
    FamiliarConfig,
    Frozen,
    LifetimeConfig,
    LockoutConfig,
    MfaAccountConfig,
    MfaCurveConfig,
    NoticeConfig,
    RuleConfig,
)
from pipeline.core.policy_waves import (
    StrangersConfig,
    StuffingConfig,
    TenantSprayConfig,
    VerifyConfig,
    WaveConfig,
)


class TenantPolicy(Frozen):
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
    verify: VerifyConfig = VerifyConfig()
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


class Policy(Frozen):
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
