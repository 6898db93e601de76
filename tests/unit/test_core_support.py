"""Builders shared by the core's unit tests (attempts, policies, outputs); no tests here."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from pipeline.contracts.models import Alert, Decision
from pipeline.core.attempt import Attempt
from pipeline.core.engine import Engine
from pipeline.core.outbox import Outbox
from pipeline.core.policy import Policy, policy_from_mapping

T0 = 1_790_000_000_000  # 2026-09-21, a minute boundary
SEC = 1000
MIN = 60 * SEC
HOUR = 60 * MIN
TENANT = "default"
ACCOUNT = "a" * 32
SOURCE = "198.51.100.7"

_ids = itertools.count()


def att(
    t: int,
    account: str = ACCOUNT,
    source: str = SOURCE,
    *,
    success: bool = False,
    reason: str | None = "bad_password",
    tenant: str = TENANT,
    device: str | None = None,
    trusted: bool = False,
    session: str | None = None,
    flow: str = "login",
    event_id: str | None = None,
) -> Attempt:
    """One normalised attempt at ``T0 + t``; a failure unless ``success``."""
    return Attempt(
        event_id=event_id if event_id is not None else f"ev-{next(_ids)}",
        occurred_ms=T0 + t,
        tenant=tenant,
        account=account,
        source=source,
        device=device,
        session=session,
        trusted=trusted and device is not None,
        flow=flow,
        success=success,
        failure_reason=None if success else reason,
    )


def policy(version: str = "test-1", **defaults: Any) -> Policy:
    """The default policy with ``defaults`` merged in (nested dicts per rule)."""
    return policy_from_mapping({"policy_version": version, "defaults": defaults})


def decisions(out: Outbox) -> list[Decision]:
    """The decisions in ``out`` (tombstones left out)."""
    return [d for _, d in out.decisions if d is not None]


def tombstones(out: Outbox) -> list[str]:
    """The keys tombstoned in ``out``."""
    return [k for k, d in out.decisions if d is None]


def alerts(out: Outbox, kind: str) -> list[Alert]:
    return [a for a in out.alerts if a.type == kind]


def run(attempts: Iterable[Attempt], pol: Policy | None = None) -> tuple[Engine, list[Any]]:
    """A fresh engine fed ``attempts``; returns it and the verdicts."""
    engine = Engine(pol) if pol is not None else Engine()
    verdicts = engine.step_batch(attempts)
    return engine, verdicts


def serialised(out: Outbox) -> list[tuple[str, bytes | None]]:
    """Decisions, tombstones and alerts as bytes, in order (for byte-identity checks)."""
    rows: list[tuple[str, bytes | None]] = [
        (key, d.model_dump_json().encode() if d is not None else None) for key, d in out.decisions
    ]
    rows.extend(("alert", a.model_dump_json().encode()) for a in out.alerts)
    return rows


def mixed_traffic(n: int, seed: int = 1, mean_gap_ms: int = 300) -> list[Attempt]:
    """Deterministic traffic with every rule in play: users (trusted or not, all flows,
    typos and successes), brute force, a botnet, a sprayer and a stuffer."""
    import random

    rng = random.Random(seed)
    users = [
        (
            f"{rng.getrandbits(128):032x}",
            f"10.0.{i // 200}.{i % 200}",
            f"{rng.getrandbits(128):032x}",
        )
        for i in range(200)
    ]
    victims = [f"{rng.getrandbits(128):032x}" for _ in range(3)]
    out: list[Attempt] = []
    t = 0
    for i in range(n):
        t += int(rng.expovariate(1 / mean_gap_ms))
        r = rng.random()
        eid = f"mx-{seed}-{i}"
        if r < 0.6:
            account, source, device = rng.choice(users)
            flow = rng.choice(["login", "login", "login", "token", "uia", "mfa"])
            trusted = rng.random() < 0.6
            out.append(
                att(
                    t,
                    account,
                    source,
                    success=rng.random() < 0.85,
                    device=device,
                    trusted=trusted,
                    session=device if flow == "uia" else None,
                    flow=flow,
                    event_id=eid,
                )
            )
        elif r < 0.75:
            out.append(att(t, victims[i % 3], f"100.64.0.{i % 3}", event_id=eid))
        elif r < 0.85:
            out.append(
                att(t, victims[0], f"203.0.{rng.randrange(2)}.{rng.randrange(150)}", event_id=eid)
            )
        elif r < 0.95:
            out.append(att(t, f"{rng.getrandbits(128):032x}", "100.65.0.1", event_id=eid))
        else:
            reason = "unknown_account" if rng.random() < 0.9 else "bad_password"
            out.append(
                att(t, f"{rng.getrandbits(128):032x}", "100.66.0.1", reason=reason, event_id=eid)
            )
    return out
