"""What a shard's step produces (``Outbox``), its counters (``Metrics``) and the tenant
shares the shards hand to the rollup.

A tenant share is a shard's count of distinct subjects in one (tenant, window): distinct
failing accounts (``ACCOUNT_SHARE``, rule 8), distinct failing sources (``SOURCE_SHARE``,
rule 8), distinct unknown accounts (``UNKNOWN_SHARE``, ``stuffing_tenant``), and the
strangers' failing sources and those of them redeemed (``STRANGER_SHARE``,
``REDEEMED_SHARE``, ``strangers_tenant``). Shares
are absolute (the shard's latest count), so the rollup can take the newest and ignore
older ones; the kind letters travel on the stages' wire and never change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from pipeline.contracts.models import AccountNotice, Alert, Decision
from pipeline.core.attempt import Attempt

ACCOUNT_SHARE: Final = "a"
"""A share of distinct failing accounts (the account stage's, rule 8)."""
SOURCE_SHARE: Final = "s"
"""A share of distinct failing sources (the source stage's, rule 8)."""
UNKNOWN_SHARE: Final = "u"
"""A share of distinct unknown accounts (the source stage's, ``stuffing_tenant``)."""
STRANGER_SHARE: Final = "x"
"""A share of strangers' sources with a failure (the source stage's, ``strangers_tenant``)."""
REDEEMED_SHARE: Final = "r"
"""A share of those sources redeemed by a sign-in (the source stage's, ``strangers_tenant``)."""
SOURCE_KINDS: Final = (SOURCE_SHARE, UNKNOWN_SHARE, STRANGER_SHARE, REDEEMED_SHARE)
"""The share kinds the source stage sends, in the order of their slot within one row."""

Shares = dict[tuple[str, int], int]
"""(tenant, window) -> a shard's count of distinct subjects in that window."""


@dataclass
class Outbox:
    """What a step produced, in order. ``decisions`` holds ``(key, Decision | None)``;
    None is a tombstone (the decision was lifted early or expired). ``tenant_shares`` and
    ``unknown_shares`` hold the shares the step changed (their latest value)."""

    decisions: list[tuple[str, Decision | None]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    forwards: list[Attempt] = field(default_factory=list)
    tenant_shares: Shares = field(default_factory=dict)
    """Distinct failing accounts (account stage) or sources (source stage): rule 8."""
    notices: list[AccountNotice] = field(default_factory=list)
    unknown_shares: Shares = field(default_factory=dict)
    """The source stage's distinct unknown accounts (``stuffing_tenant``)."""
    stranger_shares: Shares = field(default_factory=dict)
    """The source stage's strangers' failing sources, by the window they failed in."""
    redeemed_shares: Shares = field(default_factory=dict)
    """The source stage's strangers' sources redeemed, by the window they failed in."""
    exempts: list[tuple[str, bytes]] = field(default_factory=list)
    """Familiar pairs (action ``exempt``), encoded (``records.encode_exempt``): published
    on the decisions topic like the decisions, kept apart so a policy's decisions (and
    their diff) are not drowned by one record per account and source its owner signs in
    from."""

    def clear(self) -> None:
        self.exempts.clear()
        self.notices.clear()
        self.decisions.clear()
        self.alerts.clear()
        self.forwards.clear()
        self.tenant_shares.clear()
        self.unknown_shares.clear()
        self.stranger_shares.clear()
        self.redeemed_shares.clear()


@dataclass
class Metrics:
    """Counters a shell exports: what the core did and where its bounds bit."""

    counted: int = 0
    duplicates: int = 0
    late: int = 0
    decisions: int = 0
    lifts: int = 0
    alerts: int = 0
    familiar_quota_reached: int = 0
    """Successes whose new place or client was not made familiar (``new_per_day``)."""


def add_share(shares: Shares, tenant: str, window: int, bound: int, changed: Shares) -> None:
    """One more distinct subject in the (tenant, window) share, recorded in ``changed``
    (an outbox's shares); ``shares`` keeps at most ``bound`` windows (the oldest go)."""
    slot = (tenant, window)
    value = shares.get(slot, 0) + 1
    shares[slot] = value
    changed[slot] = value
    if len(shares) > bound:
        # Old windows are closed: keep the dict bounded (insertion order = age).
        del shares[next(iter(shares))]
