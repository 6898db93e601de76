"""The session review: the step-up a session signed in during a wave's lead-in owes.

A stuffing wave is detected seconds after it starts (rule 8 needs 20 failing accounts);
a valid credential tried before that signs in unchallenged. The wave's decision reaches
back over its lead-in (``pipeline.core.rollup``: ``issued_at - window_ms``), and a login
service asks, on the requests of its young sessions, whether one signed in within it owes
a step-up (the edge's ``GET /v1/session``; the scorecard's ``replay_sessions``). Pure: no
I/O, time is a parameter.
"""

from __future__ import annotations

from pipeline.core.decisions import DecisionIndex
from pipeline.core.keys import Key


def review_session(
    index: DecisionIndex,
    tenant: str,
    account: str,
    source: str,
    device: str | None,
    signed_in_ms: int,
    now_ms: int,
) -> str | None:
    """The step-up a session now owes, or None.

    The session signed in at ``signed_in_ms`` from an untrusted client without meeting a
    challenge (the login service asks only for such sessions). It owes a ``step_up`` exactly
    when the tenant's wave challenge is in force at ``now_ms`` (action ``challenge``) with a
    lead-in (``window_ms`` > 0) that began at or before the sign-in, unless the account was
    familiar at the source, or with the client, before the lead-in began: the owner at
    their own place is never asked, a credential the wave tried before it was detected is.
    Nothing here depends on whether the account exists (the same answer for absent ones).
    """
    wave = index.get(("tenant", tenant, None, None, None))
    if (
        wave is None
        or wave.action != "challenge"
        or wave.expires_ms <= now_ms
        or wave.since_ms < 0
        or signed_in_ms < wave.since_ms
        or signed_in_ms > now_ms
    ):
        return None
    familiar: list[Key] = [("familiar", tenant, account, source, None)]
    if device:
        familiar.append(("familiar", tenant, account, None, device))
    for key in familiar:
        entry = index.get(key)
        if (
            entry is not None
            and entry.action == "exempt"
            and entry.expires_ms > now_ms
            and 0 <= entry.since_ms < wave.since_ms
        ):
            return None
    return "step_up"
