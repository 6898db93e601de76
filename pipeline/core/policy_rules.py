"""The policy's per-rule sections: the frozen models of each ``[defaults.<rule>]`` table
for the per-account, per-device and per-source rules (the wave detectors' are in
``policy_waves``; ``policy`` assembles them per tenant and parses the TOML).

Every enforcing rule has ``mode = "enforce" | "observe"``; observe-mode decisions are
published with ``action = "observe"`` and never refuse. Pydantic models: not compiled.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Mode = Literal["enforce", "observe"]
MINUTE_MS = 60_000
WINDOW_MS = 15 * MINUTE_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
MAX_WINDOW_MS = 7 * 24 * HOUR_MS
MAX_BLOCK_MS = 366 * 24 * HOUR_MS
"""Longest block: keeps ``expires_at`` a representable timestamp whatever the config says."""


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RuleConfig(Frozen):
    """A sliding-window threshold: ``threshold`` events within ``window_ms`` trip the rule."""

    threshold: int = Field(ge=1, le=1_000_000)
    window_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_WINDOW_MS)
    mode: Mode = "enforce"


class BackoffConfig(Frozen):
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


class LifetimeConfig(Frozen):
    """NIST 800-63B: this many consecutive failures with no success raise ``lifetime_bound``
    (rule 7's alert counts every flow's failures), and this many consecutive untrusted
    password failures (the lockout's count) refuse untrusted password attempts until a
    success, a reset proven through the mailbox or an operator's ``decisions unlock``
    (``block_ms = 0``, the default: seed 004's SHALL is "disable"), or for ``block_ms``
    when set. The same holds ``mfa_bound`` (``MfaAccountConfig``).

    A hold is published for at most ``publish_ms`` (24 h) and published again, for as
    long, once half of it has passed while the hold lasts (event time: the shard renews
    it at its next event past that point): a decision lost with its state (an entry
    evicted, a shard that forgot it) ends within ``publish_ms`` instead of never.

    ``memory_ms`` is how long rule 7's streak survives a quiet account; 0 (the default)
    never forgets: memory is bounded by ``entry_cap``, not by time.
    """

    threshold: int = Field(100, ge=1)
    block_ms: int = Field(0, ge=0, le=MAX_BLOCK_MS)
    memory_ms: int = Field(0, ge=0, le=MAX_BLOCK_MS)
    publish_ms: int = Field(DAY_MS, ge=2 * MINUTE_MS, le=MAX_BLOCK_MS)

    @field_validator("block_ms")
    @classmethod
    def _zero_or_a_second(cls, value: int) -> int:
        if 0 < value < 1000:
            raise ValueError("lifetime.block_ms must be 0 (until a success) or >= 1000")
        return value

    mode: Mode = "enforce"


class LockoutConfig(Frozen):
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
    At most ``in_flight_max`` failures are counted in flight per lock (from its coming
    into force until it ends; 10: the curve's next two steps), so one burst of parallel
    guesses inside the latency cannot count 100 at once and hold the owner under the
    lifetime bound; the ones past it are taken as refused (``0``: none counted).
    """

    threshold: int = Field(5, ge=1, le=1_000_000)
    base_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_BLOCK_MS)
    step: int = Field(5, ge=1, le=1_000_000)
    cap_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)
    trusted_success_clears: bool = False
    in_flight_ms: int = Field(2000, ge=0, le=MAX_BLOCK_MS)
    in_flight_max: int = Field(10, ge=0, le=1_000_000)
    mode: Mode = "enforce"

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> LockoutConfig:
        if self.cap_ms < self.base_ms:
            raise ValueError("lockout.cap_ms must be >= lockout.base_ms")
        return self


class MfaCurveConfig(Frozen):
    """Seed 004's second-factor curve: after the n-th consecutive failure per (account,
    device or session) the next attempt waits ``min(cap_ms, factor_ms * 2**(n-1))``; a
    success resets n; nothing decays. ``enabled = false`` falls back to the ``mfa``
    window rule."""

    enabled: bool = True
    factor_ms: int = Field(1000, ge=1, le=MAX_BLOCK_MS)
    cap_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)
    mode: Mode = "enforce"


class NoticeConfig(Frozen):
    """Seed 001's unlock mail: at most one notice per account per ``window_ms`` when an
    untrusted lock on it trips (consecutive lock, ceiling, lifetime bound)."""

    enabled: bool = True
    window_ms: int = Field(24 * HOUR_MS, ge=1000, le=MAX_BLOCK_MS)


class FamiliarConfig(Frozen):
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
    place or client is not published (``authpipe_familiar_quota_reached``).

    For ``after_reset_ms`` after a new password was set (a ``reset`` proven through the
    mailbox, or a ``recovery`` success), the account's failures anywhere are its owner's
    other clients still holding the old password (a phone's mail app retrying from
    carrier addresses): the wave's counts (rule 8, the strangers tier) leave them out,
    as they leave out a failure at a familiar place. Nothing is published for it and
    every other count (the lock, the pair, the source's rules) goes on; the password an
    attacker holds from a breach is the old one, so it gains nothing (0: off). The familiar
    tables have their own cap, ``entry_cap`` (1,000,000 per tenant): a tenant's people
    make places familiar faster than the other tables fill (phones on carrier NATs sign in
    from a new address every few logins), and an entry evicted at the cap is an owner who
    is challenged in the next wave."""

    enabled: bool = True
    memory_ms: int = Field(30 * DAY_MS, ge=1000, le=MAX_BLOCK_MS)
    renew_ms: int = Field(DAY_MS, ge=1000, le=MAX_BLOCK_MS)
    shared_accounts: int = Field(3, ge=1, le=1_000_000)
    new_per_day: int = Field(20, ge=0, le=1_000_000)
    after_reset_ms: int = Field(DAY_MS, ge=0, le=MAX_BLOCK_MS)
    entry_cap: int = Field(1_000_000, ge=10, le=100_000_000)
    """Entries per ``familiar`` table and tenant (the tenant's ``entry_cap`` bounds the
    others): successes, not attackers' identifiers, fill it (``new_per_day`` bounds what
    one account adds), and an owner evicted from it loses the exemption."""

    @model_validator(mode="after")
    def _renew_within_memory(self) -> FamiliarConfig:
        if self.renew_ms > self.memory_ms:
            raise ValueError("familiar.renew_ms must be <= familiar.memory_ms")
        return self


class ChallengeFailuresConfig(Frozen):
    """Bot evidence: a source that fails ``threshold`` challenges (``flow = "challenge"``,
    outcome failure) within ``window_ms`` is blocked for its untrusted password attempts
    for ``block_ms`` (rule ``challenge_failures``, scope ``source``), unless it is shared
    by real users (``FamiliarConfig.shared_accounts``). Failing a challenge says nothing
    about whether an account exists."""

    threshold: int = Field(5, ge=1, le=1_000_000)
    window_ms: int = Field(WINDOW_MS, ge=1000, le=MAX_WINDOW_MS)
    block_ms: int = Field(HOUR_MS, ge=1000, le=MAX_BLOCK_MS)
    mode: Mode = "enforce"


class MfaAccountConfig(Frozen):
    """NIST SP 800-63B's bound for one-time codes, per account: ``threshold`` consecutive
    ``mfa`` failures of the account over every device, cookie and session refuse its
    second-factor checks (key ``mfa|t|a|-|-``) until a success of the second factor,
    a reset proven through the mailbox, or ``lifetime.block_ms``."""

    threshold: int = Field(100, ge=1, le=1_000_000)
    mode: Mode = "enforce"
