"""What every component builds the same way from settings: the policy and the Normaliser.

The worker, the edge, the simulator, the scorecard, the backtest and the report must
agree on both (the same digests, sources and case rules), so each builds them here and
none reaches into another's package for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from pipeline.core.attempt import Normaliser
from pipeline.core.grouping import within_grouping
from pipeline.core.keys import Digester
from pipeline.core.normalise import Network, NetworkSet, SourceRules, parse_nat64_prefix
from pipeline.core.policy import DEFAULT_POLICY, Policy, policy_from_toml
from pipeline.errors import ConfigError
from pipeline.settings import Settings, require_digest_key


def load_policy(path: Path | None) -> Policy:
    """The policy from a TOML file, or the built-in defaults."""
    if path is None:
        return DEFAULT_POLICY
    return policy_from_toml(path.read_text(encoding="utf-8"))


def build_normaliser(settings: Settings, policy: Policy | None = None) -> Normaliser:
    """The Normaliser every component must share (worker, edge, simulator, reports).

    Case-sensitive tenants are ``ingest.case_sensitive_tenants`` plus the tenants whose
    policy says ``case_sensitive = true``; the policy is ``settings.policy_path`` unless
    given. Raises ConfigError for ``case_sensitive`` in the policy's ``[defaults]``, which
    a list of tenants cannot express.
    """
    if policy is None:
        policy = load_policy(settings.policy_path)
    if policy.defaults.case_sensitive:
        raise ConfigError(
            "the policy sets case_sensitive = true in [defaults]; set it per tenant "
            "([tenants.<name>] case_sensitive = true) or list the tenants in "
            "ingest.case_sensitive_tenants"
        )
    ingest = settings.ingest
    return Normaliser(
        digester=Digester(require_digest_key(settings)),
        sources=SourceRules(
            trusted_proxies=NetworkSet(ingest.trusted_proxies),
            ipv4_prefix=ingest.ipv4_prefix,
            ipv6_prefix=ingest.ipv6_prefix,
            nat64_prefixes=nat64_networks(settings),
        ),
        case_sensitive_tenants=frozenset(ingest.case_sensitive_tenants)
        | policy.case_sensitive_tenants(),
    )


def nat64_networks(settings: Settings) -> tuple[Network, ...]:
    """``ingest.nat64_prefixes`` parsed (validated when the settings loaded), in order: what
    the normaliser folds and every grouping check must fold alike."""
    return tuple(parse_nat64_prefix(text) for text in settings.ingest.nat64_prefixes)


@functools.cache
def source_check(
    ipv4_prefix: int, ipv6_prefix: int, nat64_prefixes: tuple[Network, ...] = ()
) -> Callable[[str], bool]:
    """Whether a decision's source is one source under this grouping (no wider than
    ``ipv4_prefix`` / ``ipv6_prefix``, not written in IPv6 inside ``nat64_prefixes``): the
    ``source_ok`` every reader of the decisions topic hands
    ``pipeline.contracts.codec.decode_decision``."""
    return functools.partial(
        within_grouping,
        ipv4_prefix=ipv4_prefix,
        ipv6_prefix=ipv6_prefix,
        nat64_prefixes=nat64_prefixes,
    )


def grouping_check(settings: Settings) -> Callable[[str], bool]:
    """``source_check`` for ``settings``' grouping (``ingest.ipv4_prefix`` / ``ipv6_prefix``,
    ``ingest.nat64_prefixes``)."""
    ingest = settings.ingest
    return source_check(ingest.ipv4_prefix, ingest.ipv6_prefix, nat64_networks(settings))
