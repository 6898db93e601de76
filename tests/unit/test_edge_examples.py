"""The gateway examples (issue 6): the Python login service asks a real edge service and
always verifies exactly one hash; its events are valid login_attempt v1."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from pipeline.clock import wall_ms
from pipeline.contracts.codec import decode_attempt, dumps
from pipeline.edge.handlers import create_app
from pipeline.edge.health import AlwaysReady
from tests.plugins.kafka import free_ports
from tests.unit.test_edge_support import MIN, account_key, message, new_view

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gateway"
ACCOUNT = "Alice@Example.com"  # the support module's blocked account
PASSWORD = "correct horse battery staple"


def _load_login_service() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "example_login_service", EXAMPLES / "login_service.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


login_service = _load_login_service()


@pytest.fixture
async def edge_url() -> AsyncIterator[str]:
    """A real edge service whose view blocks ACCOUNT for ten minutes."""
    view = new_view(clock=wall_ms)
    view.apply(*message(account_key(), wall_ms() + 10 * MIN))
    server = TestServer(create_app(view, AlwaysReady()))
    await server.start_server()
    try:
        yield str(server.make_url(""))
    finally:
        await server.close()


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The hashes verify_password was asked to check, in order."""
    calls: list[str] = []
    real = login_service.verify_password

    def counting(password: str, stored: str) -> bool:
        calls.append(stored)
        return bool(real(password, stored))

    monkeypatch.setattr(login_service, "verify_password", counting)
    return calls


async def _login(
    url: str, account: str, password: str, users: dict[str, str]
) -> tuple[Any, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []

    async def report(event: dict[str, Any]) -> None:
        events.append(event)

    async with aiohttp.ClientSession() as session:
        edge = login_service.EdgeClient(session, url)
        attempt = login_service.Attempt(account, password, peer_ip="198.51.100.7")
        result = await login_service.login(attempt, edge, users, report)
    return result, events


async def test_every_path_verifies_exactly_one_hash(edge_url: str, verified: list[str]) -> None:
    """Refused, unknown, wrong and right attempts each verify one hash: the dummy one when
    refused or unknown, so they all cost the same time; each reports its reason."""
    bob_hash = login_service.hash_password(PASSWORD)
    users = {ACCOUNT: login_service.hash_password(PASSWORD), "bob": bob_hash}
    cases = [
        (ACCOUNT, PASSWORD, False, "refused", login_service.DUMMY_HASH),
        ("carol", PASSWORD, False, "unknown_account", login_service.DUMMY_HASH),
        ("bob", "wrong", False, "bad_password", bob_hash),
        ("bob", PASSWORD, True, None, bob_hash),
    ]
    for account, password, ok, reason, expected_hash in cases:
        verified.clear()
        result, events = await _login(edge_url, account, password, users)
        assert verified == [expected_hash], account
        assert result.ok is ok
        assert [event["failure_reason"] for event in events] == [reason]
        assert (result.retry_after_ms > 9 * MIN) is (reason == "refused")


async def test_unreachable_edge_fails_open_and_still_verifies_once(verified: list[str]) -> None:
    """With no edge listening, the example fails open: the real hash is checked, once."""
    users = {"bob": login_service.hash_password(PASSWORD)}
    (closed_port,) = free_ports(1)
    result, events = await _login(f"http://127.0.0.1:{closed_port}", "bob", PASSWORD, users)
    assert (result.ok, len(verified), events[0]["outcome"]) == (True, 1, "success")


def test_reported_events_are_valid_login_attempts() -> None:
    """The example's events decode as login_attempt v1 and never carry the password."""
    attempt = login_service.Attempt("bob", "hunter2", "10.0.0.5", ("203.0.113.9",), "dev-1", True)
    event = login_service.attempt_event(attempt, False, "bad_password")
    decoded = decode_attempt(dumps(event))
    assert (decoded.account, decoded.peer_ip, decoded.forwarded_for) == (
        "bob",
        "10.0.0.5",
        ("203.0.113.9",),
    )
    assert (decoded.device_trusted, decoded.outcome, decoded.failure_reason) == (
        True,
        "failure",
        "bad_password",
    )
    assert "hunter2" not in dumps(event).decode()


def test_nginx_example_uses_formats_the_edge_serves() -> None:
    """The nginx snippet and the sync script ask for block-list formats the edge has."""
    from pipeline.edge.blocklist import FORMATS

    conf = (EXAMPLES / "nginx.conf").read_text()
    script = (EXAMPLES / "sync-blocklist.sh").read_text()
    assert "?format=nginx-geo" in conf and "?format=nginx:" in conf
    assert 'format="${2:-nginx-geo}"' in script
    assert {"nginx", "nginx-geo"} <= set(FORMATS)


async def test_login_service_mails_the_owner_for_a_notice_about_its_account() -> None:
    """A notice the core emits for a locked account becomes one unlock mail to its owner;
    the digest the example computes is authpipe's; a notice for a digest not ours, or a
    copy of one already mailed, is skipped."""
    from pipeline.contracts.codec import encode
    from pipeline.core.engine import Engine
    from pipeline.core.keys import Digester
    from pipeline.settings import Settings
    from pipeline.wiring import build_normaliser
    from tests.conftest import TEST_DIGEST_KEY
    from tests.unit.test_core_support import att

    digest = Digester(TEST_DIGEST_KEY).account("default", "alice@example.com")
    normaliser = build_normaliser(Settings(identity={"digest_key": TEST_DIGEST_KEY}))
    engine = Engine()
    engine.step_batch([att(i * 1000, account=digest, source=f"203.0.113.{i}") for i in range(5)])
    (notice,) = engine.out.notices
    sent: list[tuple[str, str, str]] = []

    async def send(to: str, subject: str, body: str) -> None:
        sent.append((to, subject, body))

    mailer = login_service.NoticeMailer.for_users("default", [ACCOUNT], send, normaliser)
    assert await mailer.handle(orjson.loads(encode(notice))) is True
    ((to, _, body),) = sent
    assert (
        to == ACCOUNT
        and "remembers the device you open it on" in body
        and notice.model_dump_json() not in body
    )
    other = {**orjson.loads(encode(notice)), "account_digest": "f" * 32}
    assert await mailer.handle(other) is False and len(sent) == 1
    # A copy re-sent after a worker's restart (same notice_id) is not mailed again.
    assert await mailer.handle(orjson.loads(encode(notice))) is False and len(sent) == 1
    assert f"paused until {orjson.loads(encode(notice))['expires_at']}" in body
    # The lifetime bound holds until a success or a reset (issue 46 item 10): no date, as
    # if waiting would end it (its expires_at is only its publication's, renewed).
    held = {**orjson.loads(encode(notice)), "notice_id": "n-held", "reason": "lifetime_bound"}
    assert await mailer.handle(held) is True
    assert "paused until you sign in with this link or reset your password" in sent[-1][2]
    assert held["expires_at"] not in sent[-1][2]
