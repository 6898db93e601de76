"""The weeks before a run, in brief (``authpipe simulate --history-s N``): what a
deployment has seen by the time a wave comes, so familiar places and clients exist.

A pipeline in production has 30 days of successes behind it: the owners' homes are
familiar places for their accounts, their apps' install ids are familiar clients, and an
office or a library is a known place. A run from nothing has none of that, so every
person's first attempt meets a wave's CAPTCHA. The history is ``history_ms`` of event
time before ``start_ms``, labelled scenario ``history`` (role ``legit``, each person's
own cohort), made of:

* the baseline's ordinary traffic over the span (the same users, homes and devices);
* one sync of each phone app (the install id ``pipeline.sim.population`` gives a stale
  app, flow ``token``, a success from a carrier address): the app worked before the
  password changed;
* the returning people of the held-out shapes (``pipeline.sim.holdout_people``), a share
  of each signing in once from home on their own laptop (``RETURNING``: an assumption,
  stated with the figures in ``docs/policy.md``); the library's regulars and the office's
  colleagues sign in at their addresses.

Nothing an attacker does is in the history: its proxies stay unknown places.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from pipeline.sim.drafts import BASELINE, MAIN_TENANT, SMALL_TENANT, Draft, Label, SimConfig
from pipeline.sim.holdout import attempt
from pipeline.sim.holdout_people import (
    LIBRARY_ADDRESS,
    OFFICE_ADDRESS,
    OFFICE_COLLEAGUES,
    PER_HOUR,
    home_of,
    per_run,
    person,
)
from pipeline.sim.population import (
    MOBILE_V4_BASE,
    MOBILE_V4_SIZE,
    SHAPE,
    baseline,
    ipv4,
    main_population,
    make_user,
)

HISTORY = "history"
RETURNING = {
    "identifier_tryers": ("identifier_tryer", 0.8),
    "stale_usernames": ("stale_username", 0.9),
    "forgot_password": ("forgot_password", 0.6),
}
"""Per held-out scenario of people at home: their cohort, and the share of them who
signed in from home within the history (the rest are new here, or long away)."""
LIBRARY_REGULARS = 20


def history(cfg: SimConfig) -> Iterator[Draft]:
    """The history's drafts in time order (empty when ``cfg.history_ms`` is 0)."""
    if cfg.history_ms <= 0:
        return iter(())
    span = replace(cfg, start_ms=cfg.start_ms - cfg.history_ms, duration_ms=cfg.history_ms)
    rng = random.Random(f"{cfg.seed}/history")
    streams: list[Iterator[Draft]] = []
    if BASELINE in cfg.scenarios:
        streams.append(_relabel(baseline(span, stream=HISTORY)))
        streams.append(iter(sorted(_app_syncs(span, rng), key=_at)))
    streams.append(iter(sorted(_returning(cfg, span, rng), key=_at)))
    return heapq.merge(*streams, key=_at)


def _at(draft: Draft) -> int:
    return draft.occurred_ms


def _label(actor: str, cohort: str) -> Label:
    return Label(HISTORY, "legit", actor, cohort)


def _relabel(drafts: Iterator[Draft]) -> Iterator[Draft]:
    for draft in drafts:
        label = draft.label
        yield Draft(draft.occurred_ms, draft.fields, _label(label.actor, label.cohort))


def _device(device_id: str, trusted: bool = True) -> dict[str, Any]:
    """A sign-in's device fields: the person's own laptop was trusted then too."""
    return {"device_id": device_id, "device_trusted": trusted}


def _app_syncs(span: SimConfig, rng: random.Random) -> Iterator[Draft]:
    """One token success per phone app, from a carrier address, at a random time."""
    populations = (
        ("main", MAIN_TENANT, main_population(span.rate_per_s)),
        ("acme", SMALL_TENANT, SHAPE.small_tenant_users),
    )
    for name, tenant, users in populations:
        for index in range(users):
            user = make_user(span.seed, tenant, name, index)
            phones = [d for d in user.devices if d.kind == "phone"]
            if not phones:
                continue
            fields = {
                "tenant": tenant,
                "service": "mobile-api",
                "flow": "token",
                "account": user.account,
                "device_id": f"{phones[0].device_id}-app",
                "device_trusted": False,
                "user_agent": phones[0].user_agent,
                "peer_ip": ipv4(MOBILE_V4_BASE + rng.randrange(MOBILE_V4_SIZE)),
                "outcome": "success",
            }
            t = span.start_ms + rng.randrange(span.duration_ms)
            yield Draft(t, fields, _label(user.actor, user.cohort))


def _returning(cfg: SimConfig, span: SimConfig, rng: random.Random) -> Iterator[Draft]:
    """The held-out people who were here before, and the shared places' regulars."""
    for scenario, (cohort, share) in RETURNING.items():
        if scenario not in cfg.scenarios:
            continue
        for index in range(per_run(cfg, PER_HOUR[scenario])):
            if rng.random() >= share:
                continue
            user = person(cfg, cohort, index)
            laptop = user.devices[0]
            t = span.start_ms + rng.randrange(span.duration_ms)
            ip = home_of(user, rng)
            fields = attempt(user.account, ip, laptop.user_agent, None, **_device(laptop.device_id))
            yield Draft(t, fields, _label(user.actor, user.cohort))
    if "library" in cfg.scenarios:
        for index in range(LIBRARY_REGULARS):
            user = person(cfg, "library_regular", index)
            t = span.start_ms + rng.randrange(span.duration_ms)
            ua = user.devices[0].user_agent
            computer = _device(f"dev-lib-h{index}", trusted=False)  # a library computer
            fields = attempt(user.account, LIBRARY_ADDRESS, ua, None, **computer)
            yield Draft(t, fields, _label(user.actor, user.cohort))
    if "office_guest_wifi" in cfg.scenarios:
        for index in range(OFFICE_COLLEAGUES):
            user = person(cfg, "office_colleague", index)
            laptop = user.devices[0]
            t = span.start_ms + rng.randrange(span.duration_ms)
            device = _device(laptop.device_id)
            fields = attempt(user.account, OFFICE_ADDRESS, laptop.user_agent, None, **device)
            yield Draft(t, fields, _label(user.actor, user.cohort))
