"""The vocabulary every scenario generator shares: what to simulate (``SimConfig``), an
event before it gets its id (``Draft``) and its ground truth (``Label``), the tenants and
the user agents. ``pipeline.sim.scenarios`` has the catalogue and the merged stream."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["attacker", "owner", "legit"]

BASELINE = "baseline"

MAIN_TENANT = "default"
SMALL_TENANT = "acme"

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS

BROWSER_UAS = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:127.0) Gecko/20100101 Firefox/127.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:127.0) Gecko/20100101 Firefox/127.0",
)
PHONE_UAS = (
    "ExampleApp/8.4 (iPhone; iOS 17.5)",
    "ExampleApp/8.4 (Android 14; Pixel 8)",
)


@dataclass(frozen=True, slots=True)
class Label:
    """Ground truth of one event: who sent it and why."""

    scenario: str
    role: Role
    actor: str
    cohort: str


@dataclass(frozen=True, slots=True)
class Draft:
    """An event before it gets its id: wire fields minus ``event_id`` and ``occurred_at``."""

    occurred_ms: int
    fields: dict[str, Any]
    label: Label


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate. ``scenarios`` are names from ``SCENARIOS``."""

    scenarios: tuple[str, ...]
    rate_per_s: float
    duration_ms: int
    seed: int
    start_ms: int
    history_ms: int = 0
    """Event time before ``start_ms`` with the deployment's past (``pipeline.sim.history``)."""

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_ms
