"""The policy's tenant-wide wave detectors: ``[stuffing]``, ``[wave]``,
``[tenant_spray]`` and ``[strangers]`` (rule 8, its slow tier and the challenge they
raise). Pydantic models: not compiled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from pipeline.core.policy_rules import (
    HOUR_MS,
    MAX_WINDOW_MS,
    MINUTE_MS,
    WINDOW_MS,
    Frozen,
    Mode,
)

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


class StuffingConfig(Frozen):
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


class WaveConfig(Frozen):
    """A tenant under a wave challenges its untrusted password attempts.

    When ``spray_tenant`` (rule 8: distinct failing accounts, existence-blind) fires, the
    rollup publishes a decision on
    the tenant's key (``tenant|t|-|-|-``, action ``challenge``) demanding a CAPTCHA
    of untrusted password attempts for ``hold_ms`` after the firing (a cost for bots, no
    verification: whether a right password becomes a session is ``VerifyConfig``'s); each firing of the
    same wave extends it, so it ends ``hold_ms`` after the wave's last firing. A device
    trusted for the account is never challenged by it, nor an account at a source it
    succeeded from before (``FamiliarConfig``). ``mode = "observe"`` publishes it as
    ``observe`` (it demands nothing).

    A passed CAPTCHA (a ``flow = "challenge"`` success) is not asked again: for
    ``captcha_pass_ms`` the account shard's ``passed|t|a|-|d`` (the client's cookie, else
    ``passed|t|a|s|-``, its source) voids every CAPTCHA (the wave's, a source's) for that
    account and client, never a refusal nor ``[verify]``'s step-up. Per account: a bot
    that bought one CAPTCHA gets nothing for the next name it tries.

    The wave's **lead-in**: the decision's ``window_ms`` reaches back ``lead_in_ms``
    before the end of the wave's first firing window, so its evidence began at
    ``issued_at - window_ms``. A session signed in since then from an untrusted client
    without a challenge, at no pair or client familiar before then, is asked a step-up
    while the wave holds (``pipeline.core.decisions.review_session``, the edge's
    ``/v1/session``): the credentials a wave tried before it was detected. 0 turns the
    review off."""

    enabled: bool = True
    hold_ms: int = Field(MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    captcha_pass_ms: int = Field(
        HOUR_MS,
        ge=0,
        le=MAX_WINDOW_MS,
        description="a client that passed a CAPTCHA for an account is asked none again for "
        "that account this long (0: every time)",
    )
    lead_in_ms: int = Field(MINUTE_MS, ge=0, le=MAX_WINDOW_MS)
    mode: Mode = "enforce"

    @model_validator(mode="before")
    @classmethod
    def _no_challenge_kind(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "challenge" in data:
            raise ValueError(
                "challenge: removed (issue 44): the wave always asks a CAPTCHA, and whether "
                "a right password becomes a session is [verify]'s; delete this key"
            )
        return data


class VerifyConfig(Frozen):
    """Verify the unfamiliar sign-in (issue 44): a right password is not a session on its
    own at a place and with a client the account has not signed in from.

    An untrusted password attempt (``login``, ``token``, ``recovery``) whose account has
    no familiar exempt for its source (``familiar|t|a|s|-``) nor for its device cookie or
    app install id (``familiar|t|a|-|d``) is answered ``step_up``: the login service asks
    a possession check (a second factor or an e-mailed code) after a correct password,
    reports the right password as ``outcome = "step_up"`` and the completed sign-in as a
    ``success`` only once the check passed. Familiarity is per account and comes only
    from a completed sign-in, so an attacker's own account makes nothing familiar for
    anyone else, and no pace, duration, number of exits or bought CAPTCHA changes the
    answer. A device trusted for the account is never asked (seed 001).

    It is policy, not a decision: the worker, the edge (which reads the same policy
    file, ``settings.policy_path``) and a replay answer it alike from the familiar
    exempts in force, with nothing published (``pipeline.core.decisions``). ``observe``
    marks the attempts it would ask (audit ``decision = "observe"``) and asks nothing;
    ``off`` does neither (a tenant whose login service cannot ask a possession check)."""

    mode: Literal["off", "observe", "enforce"] = "enforce"


class TenantSprayConfig(Frozen):
    """Distinct failing accounts in a tenant per tumbling window, against its trailing baseline.

    Fires when ``distinct >= max(min_accounts, factor * baseline)`` and at least
    ``min_sources`` sources failed, where ``baseline`` is the ``baseline_quantile`` of the
    previous ``baseline_windows`` windows seen that did not fire (a low quantile, not the
    mean: a wave, or a spray from too few sources to fire, does not raise it while it
    lasts, so one wave does not mask the next; when every window of the last hour fired,
    only those whose strangers' failing sources a sign-in mostly redeemed are the sample,
    none leaving the baseline at 0: an attack of a day stays a wave for its day, and a
    lasting rise of people who mistype and then sign in is a wave for an hour at most).
    ``min_history_windows`` keeps it quiet until the rollup
    has seen that many earlier windows of the tenant: with no history the baseline is 0
    and a busy tenant's ordinary typos pass ``min_accounts``. Short windows (10 s) answer
    a wave within seconds. A paced wave (a spray from hundreds of addresses at a couple of
    attempts a second) fires on the sum of the last ``slow_windows`` windows when it
    reaches ``max(min_accounts, slow_min_accounts, slow_factor * slow_windows * slow)``
    from at least ``min_sources`` sources (``slow_windows = 1`` turns that off), ``slow``
    being the ``slow_quantile`` (the median) of the same sample: a sum of windows is near
    their mean times their number, and twice a low quantile is no margin above that once a
    window holds a few accounts (a tenant of 100 attempts a second started cold fired it
    on ordinary traffic for its first 15 minutes). ``spray_tenant`` is
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
    slow_quantile: float = Field(0.5, ge=0.0, le=1.0)
    recount_ms: int = Field(
        5 * MINUTE_MS,
        ge=0,
        le=MAX_WINDOW_MS,
        description="an account failing again sooner than this after its last failure counts once",
    )
    count_familiar: bool = Field(
        False, description="count failures of an account at a source it succeeded from"
    )


class StrangersConfig(Frozen):
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
    came from and whether anybody signed in there.

    The quick check answers a fast pool sooner than a window settles: ``quick_ms`` after
    a window ends it sums the last ``quick_span_ms`` of windows as they stand then (a
    source redeemed later still counts) and fires the same way, against
    ``max(quick_min_sources, quick_factor x baseline)``, the baseline being the
    ``quick_quantile`` of such sums (a high one: over a minute a tenant's own
    unredeemed failures are a few, and their tail, not their norm, is what must not
    fire). Most people who fail at a new place sign in within seconds (on the holdout's
    people, half within 18 s and three quarters within a minute of the failure), so its
    floor sits above what they leave unredeemed for ``quick_ms`` in a span.
    ``quick_min_sources = 0`` turns it off."""

    enabled: bool = True
    redeem_ms: int = Field(5 * MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    span_ms: int = Field(10 * MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    min_sources: int = Field(40, ge=1, le=1_000_000)
    factor: float = Field(3.0, ge=1.0)
    active_ms: int = Field(MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    max_wave_ms: int = Field(24 * HOUR_MS, ge=MINUTE_MS, le=MAX_WINDOW_MS)
    min_history_ms: int = Field(20 * MINUTE_MS, ge=0, le=MAX_WINDOW_MS)
    lead_in_ms: int = Field(5 * MINUTE_MS, ge=0, le=MAX_WINDOW_MS)
    quick_ms: int = Field(10 * 1000, ge=0, le=MAX_WINDOW_MS)
    quick_span_ms: int = Field(MINUTE_MS, ge=1000, le=MAX_WINDOW_MS)
    quick_min_sources: int = Field(10, ge=0, le=1_000_000)
    quick_factor: float = Field(2.0, ge=1.0)
    quick_quantile: float = Field(0.99, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _active_within_span(self) -> StrangersConfig:
        if self.active_ms > self.span_ms:
            raise ValueError("strangers.active_ms must be <= strangers.span_ms")
        if self.quick_ms > self.redeem_ms:
            raise ValueError(
                "strangers.quick_ms must be <= strangers.redeem_ms (the quick check comes "
                "before a window settles); set quick_min_sources = 0 to turn it off"
            )
        return self
