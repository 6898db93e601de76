"""The WebAuthn step-up (issue 47) in headless Chromium with a virtual authenticator (the
DevTools protocol's ``WebAuthn`` domain, driven over its websocket): a user enrols a security
key after a mailed-code step-up, and the next sign-in from a new browser steps up with it."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import struct
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.test_keycloak import CLIENT, REDIRECT, records_from, summary
from tests.integration.test_keycloak_email import mailed_code
from tests.integration.test_report_chromium import HEADLESS_FLAGS, chromium

if TYPE_CHECKING:
    from tests.plugins.keycloak import KeycloakStack

pytestmark = pytest.mark.integration


class DevTools:
    """One page's DevTools websocket (RFC 6455 text frames, client-masked)."""

    def __init__(self, ws_url: str) -> None:
        url = urllib.parse.urlparse(ws_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            f"GET {url.path} HTTP/1.1\r\nHost: {url.hostname}:{url.port}\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.sock.recv(1)
        assert b" 101 " in head.split(b"\r\n")[0], head
        self.last_id = 0

    def _exact(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "DevTools closed the websocket"
            data += chunk
        return data

    def _send(self, text: str) -> None:
        data, mask, n = text.encode(), os.urandom(4), len(text.encode())
        if n < 126:
            header = bytes([0x81, 0x80 | n])
        elif n < 65536:
            header = bytes([0x81, 0x80 | 126]) + struct.pack(">H", n)
        else:
            header = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def _receive(self) -> dict[str, Any]:
        message = b""
        while True:
            first, second = self._exact(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._exact(8))[0]
            payload = self._exact(n)
            opcode = first & 0x0F
            assert opcode != 8, "DevTools closed the websocket"
            if opcode in (0, 1, 2):
                message += payload
                if first & 0x80:
                    parsed: dict[str, Any] = json.loads(message)
                    return parsed

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.last_id += 1
        self._send(json.dumps({"id": self.last_id, "method": method, "params": params}))
        while True:
            answer = self._receive()
            if answer.get("id") == self.last_id:
                assert "error" not in answer, (method, answer)
                result: dict[str, Any] = answer.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return answer.get("result", {}).get("value")

    def wait_for(self, expression: str, what: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(
                f"(() => {{ try {{ return !!({expression}); }} catch (e) {{ }} }})()"
            )
            if value is True:
                return
            time.sleep(0.2)
        page = self.evaluate("document.documentElement && document.documentElement.outerHTML")
        raise AssertionError(f"no {what} within {timeout_s} s: {str(page)[:1500]}")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    """Headless Chromium (flags as the report test's) with a DevTools port."""
    profile = tmp_path / "profile"
    process = subprocess.Popen(
        [
            chromium(),
            *HEADLESS_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 20
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert time.monotonic() < deadline, "Chromium wrote no DevToolsActivePort"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t["type"] == "page"]
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        yield tools
        tools.sock.close()
    finally:
        os.killpg(process.pid, signal.SIGTERM)  # Chromium and the helpers it started
        process.wait(timeout=10)


# A page's module scripts (the WebAuthn buttons' handlers) have run once it is complete.
LOADED = "document.readyState === 'complete' && "

# The client's redirect (nothing listens there: Chromium's error page, or whatever does).
AT_CLIENT = f"location.href.startsWith('chrome-error') || location.href.startsWith('{REDIRECT}')"


def sign_in(tools: DevTools, base: str, user: str, password: str) -> None:
    """The username and password pages, in the browser."""
    query = urllib.parse.urlencode(
        {"client_id": CLIENT, "redirect_uri": REDIRECT, "response_type": "code", "scope": "openid"}
    )
    tools.call("Page.navigate", url=f"{base}/realms/authpipe/protocol/openid-connect/auth?{query}")
    for field, value in (("username", user), ("password", password)):
        tools.wait_for(f"document.querySelector('[name={field}]')", f"the {field} field")
        tools.evaluate(
            f"document.querySelector('[name={field}]').value = {json.dumps(value)};"
            f"document.querySelector('[name={field}]').form.submit()"
        )
        tools.wait_for(f"!document.querySelector('[name={field}]')", f"the {field} page to go")


def test_webauthn_step_up_with_a_virtual_authenticator(
    keycloak_stack: KeycloakStack, browser: DevTools
) -> None:
    """A user with a verified address enrols a key (Keycloak's webauthn-register after the
    mailed-code step-up); from a new browser the step-up asks the key, and the virtual
    authenticator's assertion signs them in: step_up, mfa success, success with step_up."""
    source = "203.0.113.41"
    user = f"erin-{uuid.uuid4().hex[:8]}"
    password = "erin-correct-horse"
    keycloak_stack.keycloak.admin(
        "POST",
        "/users",
        {
            "username": user,
            "enabled": True,
            "email": f"{user}@example.com",
            "emailVerified": True,
            "firstName": "Erin",
            "lastName": "Example",
            "credentials": [{"type": "password", "value": password, "temporary": False}],
            "requiredActions": ["webauthn-register"],
        },
    )
    try:
        _steps_up_with_a_key(keycloak_stack, browser, source, user, password)
    finally:  # the test home keeps its realm between sessions: no user left behind
        found = keycloak_stack.keycloak.admin("GET", f"/users?username={user}&exact=true")
        assert isinstance(found, list) and len(found) == 1
        keycloak_stack.keycloak.admin("DELETE", f"/users/{found[0]['id']}")


def _steps_up_with_a_key(
    keycloak_stack: KeycloakStack, browser: DevTools, source: str, user: str, password: str
) -> None:
    base = keycloak_stack.url.replace("127.0.0.1", "localhost")  # an IP is no WebAuthn RP id
    browser.call("Network.enable")
    browser.call("Network.setExtraHTTPHeaders", headers={"X-Forwarded-For": source})
    browser.call("WebAuthn.enable", enableUI=False)
    browser.call(
        "WebAuthn.addVirtualAuthenticator",
        options={
            "protocol": "ctap2",
            "transport": "usb",
            "hasResidentKey": True,
            "hasUserVerification": True,
            "isUserVerified": True,
            "automaticPresenceSimulation": True,
        },
    )
    since = len(keycloak_stack.mail.messages)
    sign_in(browser, base, user, password)
    code = mailed_code(keycloak_stack, user, since)
    browser.wait_for("document.querySelector('[name=otp]')", "the mailed code's page")
    browser.evaluate(
        f"document.querySelector('[name=otp]').value = '{code}';"
        "document.querySelector('[name=otp]').form.submit()"
    )
    browser.wait_for(LOADED + "document.getElementById('registerWebAuthn')", "the enrolment page")
    browser.evaluate(
        "window.prompt = () => 'virtual key'; document.getElementById('registerWebAuthn').click()"
    )
    browser.wait_for(AT_CLIENT, "the redirect to the client")
    browser.call("Network.clearBrowserCookies")  # a new browser: its device is not trusted
    sign_in(browser, base, user, password)
    browser.wait_for(
        LOADED + "document.getElementById('authenticateWebAuthnButton')", "the key page"
    )
    browser.evaluate("document.getElementById('authenticateWebAuthnButton').click()")
    browser.wait_for(AT_CLIENT, "the redirect to the client")
    records = records_from(keycloak_stack, source, 6)
    assert [summary(r)[1:] for r in records] == [
        ("login", "step_up", None, None),
        ("mfa", "success", None, None),
        ("login", "success", None, "step_up"),
        ("login", "step_up", None, None),
        ("mfa", "success", None, None),
        ("login", "success", None, "step_up"),
    ]
    assert {r["account"] for r in records} == {user}
