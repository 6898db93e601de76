"""The step-up's e-mailed code (issue 47): a user with a verified address and no second
factor signs in from a new place with the code Keycloak mails (read from the session's mail
sink), reported step_up, mfa, success with challenge step_up; five wrong codes void it and
fail the step-up cleanly, and never count in Keycloak's own brute-force detection."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.test_keycloak import (
    PASSWORDS,
    REDIRECT,
    Browser,
    _request,
    grant,
    records_from,
    summary,
)

if TYPE_CHECKING:
    from tests.plugins.keycloak import KeycloakStack

pytestmark = pytest.mark.integration


def mailed_code(stack: KeycloakStack, user: str, since: int) -> str:
    """The code in the first mail to ``user`` received from message ``since`` on."""
    mail = stack.mail.wait_for(f"{user}@example.com", since)
    found = re.search(r": (\d{6})\b", mail.text)
    assert found, mail.text
    return found.group(1)


@pytest.fixture
def keycloak_lockout_on(keycloak_stack: KeycloakStack) -> Iterator[KeycloakStack]:
    """The realm with Keycloak's own brute-force detection on (its defaults), off after."""
    keycloak_stack.keycloak.admin("PUT", "", {"bruteForceProtected": True})
    try:
        yield keycloak_stack
    finally:
        keycloak_stack.keycloak.admin("PUT", "", {"bruteForceProtected": False})


def test_grant_step_up_by_a_mailed_code(keycloak_stack: KeycloakStack) -> None:
    """Bob (no second factor, a verified address): the grant without a code mails one and
    answers step_up_required (method email); with the mailed code it signs him in."""
    source = "203.0.113.31"
    since = len(keycloak_stack.mail.messages)
    status, _, body = grant(keycloak_stack, "bob", PASSWORDS["bob"], source)
    assert (status, body["error"], body["step_up_method"]) == (401, "step_up_required", "email")
    code = mailed_code(keycloak_stack, "bob", since)
    status, _, body = grant(keycloak_stack, "bob", PASSWORDS["bob"], source, otp=code)
    assert status == 200 and "access_token" in body
    status, _, body = grant(keycloak_stack, "bob", PASSWORDS["bob"], source, otp=code)
    assert (status, body["error"]) == (401, "invalid_grant")  # used once
    assert [summary(r) for r in records_from(keycloak_stack, source, 6)] == [
        ("bob", "login", "step_up", None, None),
        ("bob", "login", "step_up", None, None),
        ("bob", "mfa", "success", None, None),
        ("bob", "login", "success", None, "step_up"),
        ("bob", "login", "step_up", None, None),
        ("bob", "mfa", "failure", "bad_second_factor", None),
    ]


def test_browser_step_up_by_a_mailed_code(keycloak_stack: KeycloakStack) -> None:
    """Carol's browser: after the password, Keycloak's code page says where the code went;
    the mailed code ends the sign-in at the client, and the browser is trusted after."""
    source = "203.0.113.32"
    since = len(keycloak_stack.mail.messages)
    browser = Browser(keycloak_stack, source)
    page = browser.submit(browser.start(), {"username": "carol"})
    page = browser.submit(page, {"password": PASSWORDS["carol"]})
    assert 'name="otp"' in page and "c***@example.com" in page
    location = browser.submit_redirect(page, {"otp": mailed_code(keycloak_stack, "carol", since)})
    assert location.startswith(REDIRECT) and "code=" in location
    browser.forget_session()
    page = browser.submit(browser.start(), {"username": "carol"})
    location = browser.submit_redirect(page, {"password": PASSWORDS["carol"]})
    assert location.startswith(REDIRECT) and "code=" in location
    records = records_from(keycloak_stack, source, 4)
    assert [summary(r) for r in records] == [
        ("carol", "login", "step_up", None, None),
        ("carol", "mfa", "success", None, None),
        ("carol", "login", "success", None, "step_up"),
        ("carol", "login", "success", None, None),
    ]
    assert [r["device_trusted"] for r in records] == [False, False, False, True]
    assert len(keycloak_stack.mail.messages) == since + 1


def brute_force_state(stack: KeycloakStack, username: str) -> dict[str, Any]:
    users = stack.keycloak.admin("GET", f"/users?username={username}&exact=true")
    assert isinstance(users, list) and len(users) == 1
    state = stack.keycloak.admin("GET", f"/attack-detection/brute-force/users/{users[0]['id']}")
    assert isinstance(state, dict)
    return state


def test_five_wrong_mailed_codes_fail_cleanly(keycloak_lockout_on: KeycloakStack) -> None:
    """Five wrong codes void the mailed code: the browser gets a 403 page (and keeps it),
    the grant a 403 access_denied, never a 500; Keycloak's detection (on here) counts none
    of them, so a new code still signs bob in."""
    stack = keycloak_lockout_on
    source = "203.0.113.33"
    since = len(stack.mail.messages)
    browser = Browser(stack, source)
    page = browser.submit(browser.start(), {"username": "bob"})
    page = browser.submit(page, {"password": PASSWORDS["bob"]})
    statuses, pages = [], [page]
    for _ in range(5):
        status, page = browser.submit_status(page, {"otp": "000000"})
        statuses.append(status)
        pages.append(page)
    assert statuses == [200, 200, 200, 200, 403] and "Too many wrong codes" in page
    # The last form posted again: Keycloak sends the stale form to the current step, which
    # stays refused (no new form, no new code).
    status, headers, _ = browser._post(pages[4], {"otp": "000000"})
    assert status == 302
    status, _, page = _request(headers["Location"], headers=browser.headers, opener=browser.opener)
    assert status == 403 and 'name="otp"' not in page
    answers = [grant(stack, "bob", PASSWORDS["bob"], source)]
    answers += [grant(stack, "bob", PASSWORDS["bob"], source, otp="000000") for _ in range(6)]
    assert [(a[0], a[2]["error"]) for a in answers] == [
        (401, "step_up_required"),
        *[(401, "invalid_grant")] * 4,
        (403, "access_denied"),
        (401, "invalid_grant"),
    ]
    assert (
        brute_force_state(stack, "bob")["numFailures"],
        brute_force_state(stack, "bob")["disabled"],
    ) == (0, False)
    before = len(stack.mail.messages)
    status, _, _ = grant(stack, "bob", PASSWORDS["bob"], source)
    assert status == 401
    code = mailed_code(stack, "bob", before)
    assert grant(stack, "bob", PASSWORDS["bob"], source, otp=code)[0] == 200
    assert len(stack.mail.messages) == before + 1 and before == since + 2
    bad = ("bob", "mfa", "failure", "bad_second_factor", None)
    step_up = ("bob", "login", "step_up", None, None)
    assert [summary(r) for r in records_from(stack, source, 23)] == [
        step_up,
        *[bad] * 5,
        step_up,
        *[step_up, bad] * 6,
        step_up,
        step_up,
        ("bob", "mfa", "success", None, None),
        ("bob", "login", "success", None, "step_up"),
    ]
