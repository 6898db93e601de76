"""Deterministic scenario generators: ordinary users and seven attacks, with ground truth.

Everything is derived from the seed: each stream has its own ``random.Random`` seeded
with ``"<seed>/<stream>"`` (string seeds are hashed with SHA-512, so stable across
processes), and per-user attributes come from a BLAKE2b digest of (seed, tenant, user).
The same ``SimConfig`` always yields the same events, ids and labels.

Time is simulated event time: ``occurred_ms`` runs from ``start_ms`` for ``duration_ms``.
``rate_per_s`` is the events per simulated second of ordinary traffic in the main tenant;
the office, the small tenant and the attacks come on top at their own fixed sizes.

The simulator models no gateway enforcement (see ``pipeline.sim``): every attempt
reaches the login service, and nothing is ever ``failure_reason = "refused"``.

Address plan (all synthetic): home IPv4 in 198.18.0.0/15, mobile carrier NAT in
172.16.0.0/12, home IPv6 in 2001:db8::/32 (one /64 per household, a new interface id
per login), the office NAT 192.0.2.10, single attackers in 203.0.113.0/24, botnets and
proxies in 100.64.0.0/10.

Scenarios (sizes fixed, placed on the timeline by ``PLACEMENT`` as fractions of the run):

* ``baseline``: tenant ``default`` users (a few logins per user per hour) with one to
  three trusted devices, a new untrusted browser in 10 % of sessions (then a second
  factor), typos (6 % of logins; after a third failure the user resets the password via
  the ``recovery`` flow), mistyped usernames (1 %), capitalised identifiers from phone
  keyboards, 30 % of households on IPv6 rotating within their /64, re-auth prompts
  (``uia``) inside live sessions, and after half of the resets a phone app that keeps the old
  password and retries it (``token`` flow, changing carrier addresses, every 40-90 s for
  10-30 min: under the ceiling of 50, over a ceiling of 10); 300 colleagues behind one office NAT address; and a
  small tenant ``acme`` (3,000 users) with the same habits;
* ``brute_force``: one address, one account, 240 guesses;
* ``distributed_brute_force``: 1,200 addresses, one account, one to three guesses each,
  while the owner keeps signing in from a trusted device;
* ``spray``: one address, 3,000 accounts (10 % unknown), two passwords;
* ``low_and_slow_spray``: 150 addresses, 1,500 accounts of tenant ``acme``, two
  passwords; at most 20 attempts and 20 accounts per address and two attempts per
  account: under every per-source and per-account threshold, for ``spray_tenant``;
* ``credential_stuffing``: 60 proxy addresses, 4,200 leaked pairs, 88 % of them for
  accounts that do not exist (``unknown_account``), 3 % of the rest succeed;
* ``lockout_dos``: a stranger fails 400 times against a victim who keeps signing in
  from a trusted device (with one typo there), and as often against a second owner who
  has no trusted device: the seed 002 lock refuses that owner too (capped at an hour;
  cohort ``owner_without_trusted_device``, classed "refused by design"), and the notice
  topic
  carries the owner's way out (seed 001's unlock mail);
* ``low_and_slow_bruteforce``: one address, one account, one guess every 4 minutes for
  the whole run (360 in 24 h): under every window;
* ``low_and_slow_bruteforce_rotating``: another account, 13 rotating addresses, one
  guess every 20 s for the whole run (4,320 in 24 h), each address under every window.
* ``uia_bruteforce``: a thief holding the victim's laptop session guesses 60 times via
  re-auth while the owner keeps working on the phone.

Group ``holdout`` (issue 24, not in ``mixed``): attacks through residential proxy pools
(``stuffing_pool_once``, ``stuffing_pool_twice``, ``stuffing_bursts``, ``spray_pool``,
``stuffing_own_account``, ``second_wave``, ``mfa_code_guessing``; ``pipeline.sim.holdout``)
and the people who look like them (``identifier_tryers``, ``stale_usernames``, ``library``,
``forgot_password``, ``office_guest_wifi``; ``pipeline.sim.holdout_people``).

Group ``adaptive`` (issue 44, not in ``mixed``): attackers who walk around a tenant-wide
count (``static_exits``, ``known_exits``, ``known_exits_fast``, ``campaign_long``,
``paced_under_floors``, ``junk_waves``, ``captcha_cafe``, ``retry_after_hit``;
``pipeline.sim.adaptive``) and people who sign in again from the same browser
(``signs_in_again``).
"""

from __future__ import annotations

import functools
import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.contracts.models import format_utc_ms, ms_to_datetime
from pipeline.errors import AuthpipeError
from pipeline.sim.adaptive import ADAPTIVE_BUILDERS
from pipeline.sim.attacks import ATTACK_BUILDERS
from pipeline.sim.drafts import BASELINE, SECOND_MS, Draft, Label, SimConfig
from pipeline.sim.history import history
from pipeline.sim.holdout import HOLDOUT_ATTACKS
from pipeline.sim.holdout_people import HOLDOUT_PEOPLE
from pipeline.sim.population import baseline

__all__ = [
    "ADAPTIVE",
    "ADAPTIVE_SCENARIOS",
    "ATTACKS",
    "BASELINE",
    "HOLDOUT",
    "HOLDOUT_SCENARIOS",
    "MIXED",
    "MIXED_SCENARIOS",
    "SCENARIOS",
    "SLOW_ATTACKS",
    "ScenarioError",
    "SimConfig",
    "SimEvent",
    "check_config",
    "generate",
    "parse_scenarios",
    "stamp",
]

ATTACKS = (
    "brute_force",
    "distributed_brute_force",
    "spray",
    "low_and_slow_spray",
    "credential_stuffing",
    "lockout_dos",
    "uia_bruteforce",
)
HOLDOUT_BUILDERS = {**HOLDOUT_ATTACKS, **HOLDOUT_PEOPLE}
HOLDOUT_SCENARIOS = tuple(HOLDOUT_BUILDERS)
"""The shapes of issue 24 (``pipeline.sim.holdout``, ``pipeline.sim.holdout_people``)."""
ADAPTIVE_SCENARIOS = tuple(ADAPTIVE_BUILDERS)
"""The adaptive attackers of issue 44 and the people beside them (``pipeline.sim.adaptive``)."""
SLOW_ATTACKS = ("low_and_slow_bruteforce", "low_and_slow_bruteforce_rotating")
"""Paced in absolute time (a guess every 4 min, every 20 s), so they mean something only
in runs of hours (``--duration-s 86400``): named explicitly, not part of ``mixed``."""
MIXED_SCENARIOS = (BASELINE, *ATTACKS)
SCENARIOS = (*MIXED_SCENARIOS, *SLOW_ATTACKS, *HOLDOUT_SCENARIOS, *ADAPTIVE_SCENARIOS)
MIXED = "mixed"
HOLDOUT = "holdout"
ADAPTIVE = "adaptive"
GROUPS = {MIXED: MIXED_SCENARIOS, HOLDOUT: HOLDOUT_SCENARIOS, ADAPTIVE: ADAPTIVE_SCENARIOS}
"""Names that select several scenarios: ``holdout`` is the shapes of issue 24
(``pipeline.sim.holdout``), ``adaptive`` those of issue 44 (``pipeline.sim.adaptive``),
none of them in ``mixed``."""
BUILDERS = {**ATTACK_BUILDERS, **HOLDOUT_BUILDERS, **ADAPTIVE_BUILDERS}


class ScenarioError(AuthpipeError):
    """An unknown scenario name or an impossible simulation config."""


@dataclass(frozen=True, slots=True)
class SimEvent:
    """One simulated event: the wire object (schema ``login_attempt`` v1) and its label."""

    event_id: str
    occurred_ms: int
    wire: dict[str, Any]
    label: Label

    def truth_row(self) -> dict[str, Any]:
        """The ground-truth line: labels plus the event itself (the scorecard needs both)."""
        return {
            "event_id": self.event_id,
            "scenario": self.label.scenario,
            "role": self.label.role,
            "actor": self.label.actor,
            "cohort": self.label.cohort,
            "tenant": self.wire["tenant"],
            "account": self.wire["account"],
            "event": self.wire,
        }


def parse_scenarios(text: str) -> tuple[str, ...]:
    """A comma-separated list of scenarios and groups (``mixed``: baseline and every attack
    but the slow ones; ``holdout``: the issue 24 shapes; ``adaptive``: issue 44's), in
    canonical order."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    chosen = {s for name in names for s in GROUPS.get(name, (name,))}
    unknown = [name for name in names if name not in GROUPS and name not in SCENARIOS]
    if unknown or not names:
        raise ScenarioError(
            f"unknown scenario {', '.join(unknown) or repr(text)}; choose {MIXED}, {HOLDOUT}, "
            f"{ADAPTIVE} or a comma-separated list of: {', '.join(SCENARIOS)}"
        )
    return tuple(name for name in SCENARIOS if name in chosen)


# -- the merged stream --------------------------------------------------------------------


def _attack_stream(cfg: SimConfig, name: str) -> Iterator[Draft]:
    drafts = BUILDERS[name](cfg, random.Random(f"{cfg.seed}/{name}"))
    drafts.sort(key=lambda d: d.occurred_ms)
    return iter(drafts)


def check_config(cfg: SimConfig) -> None:
    if cfg.rate_per_s <= 0:
        raise ScenarioError(f"rate {cfg.rate_per_s} events/s must be above 0")
    if cfg.history_ms < 0:
        raise ScenarioError(f"history {cfg.history_ms} ms must be 0 or more")
    if cfg.duration_ms < SECOND_MS:
        raise ScenarioError(f"duration {cfg.duration_ms} ms is too short; simulate at least 1 s")
    for name in cfg.scenarios:
        if name not in SCENARIOS:
            raise ScenarioError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")


@functools.lru_cache(maxsize=4096)
def _second_text(epoch_s: int) -> str:
    return format_utc_ms(ms_to_datetime(epoch_s * 1000))[:-5]


def stamp(epoch_ms: int) -> str:
    """RFC 3339 UTC with milliseconds (``format_utc_ms``), the second's text cached."""
    return f"{_second_text(epoch_ms // 1000)}.{epoch_ms % 1000:03d}Z"


def generate(cfg: SimConfig) -> Iterator[SimEvent]:
    """Every event of the run in time order (ties in a fixed stream order), with ids."""
    check_config(cfg)
    streams: list[Iterator[Draft]] = [history(cfg)]
    if BASELINE in cfg.scenarios:
        streams.append(baseline(cfg))
    streams.extend(_attack_stream(cfg, name) for name in SCENARIOS[1:] if name in cfg.scenarios)
    prefix = f"sim-{cfg.seed}-{cfg.start_ms:x}-"
    index = 0
    for draft in heapq.merge(*streams, key=lambda d: d.occurred_ms):
        if not cfg.start_ms - cfg.history_ms <= draft.occurred_ms < cfg.end_ms:
            continue
        event_id = f"{prefix}{index:08d}"
        wire = {
            "event_id": event_id,
            "occurred_at": stamp(draft.occurred_ms),
            **draft.fields,
        }
        yield SimEvent(event_id, draft.occurred_ms, wire, draft.label)
        index += 1
