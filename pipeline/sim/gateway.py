"""What a login service that follows the contract reports for one attempt under a verdict.

The model ``backtest --verdicts`` plays (``pipeline.sim.verdicts``), and what
``examples/gateway/login_service.py`` does for real (``tests/unit/test_gateway_model.py``
holds the two equal). Bots fail challenges, people pass them:

* refused: the attempt as ``failure_reason = "refused"`` (counted by no rule);
* ``captcha`` for a bot: a ``flow = "challenge"`` failure; the password is never checked;
  for a person: a ``flow = "challenge"`` success (the pass, ``#captcha``: the account
  shard's ``passed`` exempt spares the same client the next CAPTCHA for the account), then
  the attempt as below;
* a right password of an untrusted password attempt under ``Verdict.step_up``: reported
  ``outcome = "step_up"`` (counted nowhere, familiar nowhere), then the possession check
  as ``flow = "mfa"``: a bot fails it (``bad_second_factor``); a person passes it, and the
  completed sign-in follows as the attempt's own ``success``;
* otherwise the attempt as it was (a wrong password never reaches a step-up).

The extra attempts take the event id with a suffix (``#step_up``, ``#mfa``), so the
engine's dedupe keeps them apart.
"""

from __future__ import annotations

from pipeline.core.attempt import STEP_UP, Attempt
from pipeline.core.decisions import Verdict


def reported(a: Attempt, verdict: Verdict, bot: bool) -> list[Attempt]:
    """The attempts the login service reports for ``a`` under ``verdict`` (see above)."""
    if not verdict.allowed:
        return [a._replace(success=False, failure_reason="refused")]
    captcha = verdict.challenge == "captcha"
    if bot and captcha:
        return [a._replace(flow="challenge", success=False, failure_reason="other")]
    passed = (
        [
            a._replace(
                event_id=a.event_id + "#captcha",
                flow="challenge",
                success=True,
                failure_reason=None,
            )
        ]
        if captcha
        else []
    )
    step_up = verdict.step_up or verdict.challenge == "step_up"
    if not (step_up and a.success and a.password_flow and not a.trusted):
        return [*passed, a]
    stepped = a._replace(event_id=a.event_id + "#step_up", success=False, failure_reason=STEP_UP)
    mfa = a._replace(event_id=a.event_id + "#mfa", flow="mfa")
    if bot:
        return [stepped, mfa._replace(success=False, failure_reason="bad_second_factor")]
    return [*passed, stepped, mfa, a]
