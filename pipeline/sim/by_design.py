"""Refusals a seed's rule makes on purpose: counted apart, never as collateral.

A refusal of a legitimate attempt is "by design" when ``BY_DESIGN`` names its cohort and the
scope of the refusing decision, when it is a lock whose run holds an attacker's failures
(``ATTACKED_RUN``) or the account's own stale app's (``STALE_APP_RUN``), or when seed 004's
code curve asks it to wait at most ``CURVE_NOTICED_MS`` (``CURVE_FIRST_WAIT``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.core.decisions import Verdict
from pipeline.sim.truth import ATTACKER, LEGIT_ROLES, TruthEvent

BY_DESIGN: dict[tuple[str, str], str] = {
    ("stale_app", "lock"): (
        "seed 002: an app retrying a stale password from changing addresses is "
        "indistinguishable from a guesser, so it is locked like one (untrusted only, an "
        "hour at most; the owner's trusted device and the reset link still work)"
    ),
    ("owner_without_trusted_device", "account"): (
        "the ceiling (rule 2) holds the untrusted world of an account under attack, the "
        "owner without a trusted device included (escalating, an hour at most)"
    ),
    ("owner_without_trusted_device", "lock"): (
        "seed 002: a stranger's failures lock the untrusted world, the owner without a "
        "trusted device included (an hour at most); seed 001's notice mails them a sign-in "
        "link that trusts their device"
    ),
}
"""(cohort, refusing decision's scope) -> why the seeds make that refusal right."""
ATTACKED_RUN = (
    "seed 002: a stranger's failures on this account are in its consecutive run; with the "
    "owner's own untrusted failures they reached the lock, which holds the whole untrusted "
    "world, owner included (an hour at most; trusted devices and the notice's link still work)"
)
"""Why a lock refusal of any legitimate cohort is right when attackers fed the run."""
STALE_APP_RUN = (
    "seed 002: the account's own app, retrying a stale password, fed its consecutive run; "
    "the lock it reached holds every untrusted client of the account (an hour at most; "
    "trusted devices still work, and updating the app's password ends it)"
)
"""Why a lock refusal of the owner is right when their own stale app fed the run."""
CURVE_NOTICED_MS = 1000
"""Seed 004: "somebody who fat-fingers a code twice waits a second and never notices"."""
CURVE_FIRST_WAIT = (
    "seed 004: a code retried within the curve's wait after a failure waits at most a "
    'second ("somebody who fat-fingers a code twice waits a second and never notices"); '
    "the login service answers retry_after_ms"
)
"""Why a second-factor curve refusal that waits at most a second is right."""


def design_reasons(events: Sequence[TruthEvent], verdicts: Sequence[Verdict]) -> list[str | None]:
    """Per event: why a seed's rule refused this legitimate attempt on purpose, else None.

    ``BY_DESIGN`` names the cohorts a rule refuses on purpose; a lock refusal of any other
    legitimate attempt is by design when attacker failures on the account are in its run
    (since its last untrusted success; the simulator enforces nothing, so the worker counted
    them whether or not a gateway would have refused them), ``ATTACKED_RUN``, or failures of the
    account's own stale app, ``STALE_APP_RUN``; a refusal by the code curve (scope ``mfa``)
    whose ``retry_after_ms`` is at most ``CURVE_NOTICED_MS`` is ``CURVE_FIRST_WAIT``."""
    fed: dict[tuple[str, str], str] = {}
    reasons: list[str | None] = []
    for event, verdict in zip(events, verdicts, strict=True):
        a = event.attempt
        account = (a.tenant, a.account)
        key = verdict.matched_key
        reason = None
        if event.role in LEGIT_ROLES and not verdict.allowed and key is not None:
            reason = BY_DESIGN.get((event.cohort, key[0]))
            if reason is None and key[0] == "lock":
                reason = fed.get(account)
            if reason is None and key[0] == "mfa" and verdict.retry_after_ms <= CURVE_NOTICED_MS:
                reason = CURVE_FIRST_WAIT
        reasons.append(reason)
        counted = verdict.allowed and a.password_flow and not a.trusted
        # The simulated login service enforces nothing, so the worker counted an attacker's
        # failure into the run even where a gateway would have refused it.
        if a.password_flow and not a.trusted and not a.success and event.role == ATTACKER:
            fed[account] = ATTACKED_RUN
        elif counted and not a.success and event.cohort == "stale_app":
            fed.setdefault(account, STALE_APP_RUN)
        elif counted and a.success:
            fed.pop(account, None)
    return reasons
