"""Builders shared by the edge's unit and integration tests (decision messages, views,
settings); no tests here."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from structlog.testing import LogCapture

from pipeline.contracts.codec import encode
from pipeline.contracts.models import Decision, ms_to_datetime
from pipeline.core.attempt import Normaliser
from pipeline.core.keys import Key, format_key
from pipeline.core.records import APPLIES_TO
from pipeline.edge import handlers
from pipeline.edge.view import DecisionView
from pipeline.settings import Settings
from pipeline.wiring import build_normaliser

T0 = 1_790_000_000_000  # 2026-09-21T14:13:20Z
SEC = 1000
MIN = 60 * SEC
TENANT = "default"
ACCOUNT = "Alice@Example.com"
PEER = "198.51.100.7"
PROXY = "10.1.2.3"
DIGEST_KEY = "edge-test-digest-key-0123456789abcdef"
SETTINGS = Settings(
    identity={"digest_key": DIGEST_KEY},
    ingest={"trusted_proxies": ["10.0.0.0/8"], "ipv6_prefix": 64},
)

_ids = itertools.count()


class Clock:
    """A settable epoch-ms clock for views."""

    def __init__(self, now_ms: int = T0) -> None:
        self.now = now_ms

    def __call__(self) -> int:
        return self.now


def normaliser(settings: Settings = SETTINGS) -> Normaliser:
    """The worker's normaliser for ``settings`` (the edge must use the same)."""
    return build_normaliser(settings)


def new_view(clock: Callable[[], int] | None = None, settings: Settings = SETTINGS) -> DecisionView:
    return DecisionView(normaliser(settings), now_ms=clock or Clock())


def account_digest(account: str = ACCOUNT, tenant: str = TENANT) -> str:
    return normaliser().account_digest(tenant, account)


def device_digest(device: str, tenant: str = TENANT) -> str:
    return normaliser().digester.device(tenant, device)


def session_digest(session: str, tenant: str = TENANT) -> str:
    return normaliser().digester.session(tenant, session)


def account_key(account: str = ACCOUNT, tenant: str = TENANT) -> Key:
    return ("account", tenant, account_digest(account, tenant), None, None)


def account_source_key(source: str = PEER, account: str = ACCOUNT, tenant: str = TENANT) -> Key:
    return ("account_source", tenant, account_digest(account, tenant), source, None)


def device_key(device: str, account: str = ACCOUNT, tenant: str = TENANT) -> Key:
    return ("device", tenant, account_digest(account, tenant), None, device_digest(device, tenant))


def source_key(source: str, tenant: str = TENANT) -> Key:
    return ("source", tenant, None, source, None)


def decision(
    key: Key,
    expires_ms: int,
    *,
    action: str = "block",
    issued_ms: int = T0,
    decision_id: str | None = None,
    window_ms: int = 15 * MIN,
    challenge: str | None = None,
) -> Decision:
    """A decision as the worker writes it."""
    scope, tenant, account, source, device = key
    return Decision(
        decision_id=decision_id or f"d{next(_ids):031d}",
        key=format_key(key),
        tenant=tenant,
        scope=scope,  # type: ignore[arg-type]
        account_digest=account,
        source=source,
        device_id=device,
        applies_to=APPLIES_TO[scope],  # type: ignore[arg-type]
        action=action,  # type: ignore[arg-type]
        rule=scope,
        count=5,
        threshold=5,
        window_ms=window_ms,
        issued_at=ms_to_datetime(issued_ms),
        expires_at=ms_to_datetime(expires_ms),
        policy_version="edge-test-1",
        challenge=challenge,  # type: ignore[arg-type]
    )


def message(key: Key, expires_ms: int, **kw: object) -> tuple[bytes, bytes]:
    """(Kafka key, value) of a decision."""
    return format_key(key).encode(), encode(decision(key, expires_ms, **kw))  # type: ignore[arg-type]


def tombstone(key: Key) -> tuple[bytes, None]:
    return format_key(key).encode(), None


@contextmanager
def edge_logs() -> Iterator[list[dict[str, Any]]]:
    """The edge handlers' log entries while the block runs (as ``capture_logs`` gives them),
    whatever structlog's global configuration: a test that configured logging in process at
    another level, with loggers cached on first use, hides the edge's lines from
    ``capture_logs`` in every later test of its worker."""
    capture = LogCapture()
    saved = handlers.log
    handlers.log = structlog.wrap_logger(
        None,
        processors=[capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
        cache_logger_on_first_use=False,
        component="edge",
    )
    try:
        yield capture.entries
    finally:
        handlers.log = saved
