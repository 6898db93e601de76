"""The example login service's ALTCHA CAPTCHA in a real browser (issue 47 item 2): headless
Chromium (Debian's) solves the widget the service serves itself and signs in; a bot that
posts without a solution, with a forged one or with the browser's spent one gets nowhere.

The edge is the real edge service with a tenant wave's CAPTCHA in its view. Chromium is
driven over the DevTools protocol (aiohttp's WebSocket client, no extra package). Chromium
must be installed (``scripts/setup`` does it) and the widget vendored
(``scripts/altcha-widget``): either missing fails this test with that advice, never a skip.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from pipeline.clock import wall_ms
from pipeline.contracts.codec import decode_attempt, dumps
from pipeline.edge.handlers import create_app
from pipeline.edge.health import AlwaysReady
from tests.integration.test_report_chromium import HEADLESS_FLAGS, chromium
from tests.unit.test_edge_examples import PASSWORD, login_service
from tests.unit.test_edge_support import MIN, message, new_view

pytestmark = pytest.mark.timeout(60)  # it takes about 3 s
KEY = "altcha-test-hmac-key-0123456789abcdef"
WAIT_S = 15.0


def widget_js() -> Path:
    try:
        return login_service.altcha_widget_js()
    except login_service.CaptchaConfigError as exc:
        pytest.fail(str(exc), pytrace=False)


class Page:
    """One tab over the DevTools protocol: evaluate JavaScript, keep what the page logged."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.ids, self.logged = ws, itertools.count(1), list[dict[str, Any]]()

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        await self.ws.send_json({"id": call_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == call_id:
                assert "error" not in msg, (method, msg["error"])
                return dict(msg["result"])
            if msg.get("method") in ("Runtime.exceptionThrown", "Log.entryAdded"):
                self.logged.append(msg["params"])

    async def value(self, expression: str) -> Any:
        """The expression's value; None while a navigation replaces the document."""
        try:
            done = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        except AssertionError:
            return None
        return None if "exceptionDetails" in done else done["result"].get("value")

    async def until(self, expression: str, what: str) -> Any:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if value := await self.value(expression):
                return value
            await asyncio.sleep(0.05)
        body = await self.value("document.documentElement.outerHTML")
        raise AssertionError(f"{what}: not within {WAIT_S} s; page: {str(body)[:1500]}")

    def errors(self) -> list[dict[str, Any]]:
        """Script errors and errors logged (a CSP violation is one), but not the network's
        (the sign-in pages' 401 and 403 statuses, the absent favicon)."""
        return [
            p
            for p in self.logged
            if "exceptionDetails" in p
            or (p["entry"]["level"] == "error" and p["entry"]["source"] != "network")
        ]


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    """A fresh headless Chromium (its own profile) and its one tab."""
    profile = tmp_path / "profile"
    proc = await asyncio.create_subprocess_exec(
        chromium(),
        *HEADLESS_FLAGS,
        f"--user-data-dir={profile}",
        "--remote-debugging-port=0",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + WAIT_S
        while not port_file.is_file() or not port_file.read_text().strip():
            assert proc.returncode is None, f"chromium exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromium wrote no DevToolsActivePort"
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                targets = await resp.json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
            async with session.ws_connect(url, max_msg_size=0) as ws:
                tab = Page(ws)
                await tab.call("Runtime.enable")
                await tab.call("Log.enable")
                yield tab
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


@pytest.fixture
async def service() -> AsyncIterator[tuple[str, list[dict[str, Any]], list[str]]]:
    """The example login service's page (bob's password) in front of a real edge whose view
    holds a tenant wave's CAPTCHA: (its URL, the events it reported, the hashes checked)."""
    view = new_view(clock=wall_ms)
    wave = ("tenant", "default", None, None, None)
    now = wall_ms()
    view.apply(
        *message(wave, now + 10 * MIN, action="challenge", challenge="captcha", issued_ms=now)
    )
    edge = TestServer(create_app(view, AlwaysReady()))
    await edge.start_server()
    events: list[dict[str, Any]] = []
    verified: list[str] = []

    async def report(event: dict[str, Any]) -> None:
        events.append(event)

    real = login_service.verify_password

    def counting(password: str, stored: str) -> bool:
        verified.append(stored)
        return bool(real(password, stored))

    users = {"bob": login_service.hash_password(PASSWORD)}
    app = login_service.login_app(
        str(edge.make_url("")),
        users,
        login_service.AltchaCaptcha(KEY),
        report,
        widget_js=widget_js(),
    )
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    login_service.verify_password = counting
    try:
        yield str(server.make_url("")).rstrip("/"), events, verified
    finally:
        login_service.verify_password = real
        await server.close()
        await edge.close()


def shape(events: list[dict[str, Any]]) -> list[tuple[str, str | None, str, str | None]]:
    decoded = [decode_attempt(dumps(event)) for event in events]
    return [(e.flow, e.challenge, e.outcome, e.failure_reason) for e in decoded]


async def bot_post(url: str, **form: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/login", data=form) as resp:
        return resp.status, await resp.text()


async def test_chromium_solves_the_widget_and_signs_in_and_a_bot_does_not(
    service: tuple[str, list[dict[str, Any]], list[str]], page: Page
) -> None:
    """The person: the password form, the edge's CAPTCHA (the widget page, 401, nothing
    reported), the widget solves as the page loads (its script from the service itself),
    the sign-in proceeds: a challenge success, then the login success, one hash checked; no
    script error or CSP violation. The bot: no solution (401, nothing reported, no hash), a
    forged one (403, a challenge failure), the browser's spent payload (403, replayed)."""
    url, events, verified = service
    started = time.monotonic()
    await page.call("Page.navigate", url=f"{url}/login")
    await page.until("document.forms.login && document.readyState === 'complete'", "the form")
    fill = f"document.forms.login.password.value = {json.dumps(PASSWORD)};"
    await page.value(f"document.forms.login.account.value = 'bob'; {fill}")
    await page.value("document.forms.login.requestSubmit()")
    await page.until("!!document.querySelector('altcha-widget')", "the widget page")
    assert (events, verified) == ([], [])  # a CAPTCHA demanded: nothing tried yet
    await page.value(fill)
    solved = "document.querySelector('input[name=altcha]')?.value"
    payload = await page.until(solved, "the widget's solution")
    solved_s = time.monotonic() - started
    await page.value("document.forms.login.requestSubmit()")
    result = await page.until("document.querySelector('[data-result]')?.dataset.result", "result")
    assert result == "signed-in"
    assert shape(events) == [
        ("challenge", "captcha", "success", None),
        ("login", None, "success", None),
    ]
    assert len(verified) == 1 and page.errors() == [], page.errors()
    sent = json.loads(base64.b64decode(payload))
    assert sent["challenge"]["parameters"]["algorithm"] == login_service.ALTCHA_ALGORITHM
    assert sent["solution"]["derivedKey"].startswith(login_service.ALTCHA_KEY_PREFIX)
    assert solved_s < WAIT_S

    events.clear(), verified.clear()
    status, body = await bot_post(url, account="bob", password=PASSWORD)
    assert (status, "<altcha-widget" in body, events, verified) == (401, True, [], [])
    for forged, expected in (("bm90IGEgcGF5bG9hZA==", 403), (payload, 403)):
        status, body = await bot_post(url, account="bob", password=PASSWORD, altcha=forged)
        assert (status, "data-result" in body) == (expected, False)
    assert shape(events) == [("challenge", "captcha", "failure", "other")] * 2
    assert verified == []
