"""A login handler that asks the authpipe edge before it verifies a password.

The flow of one attempt:

1. ask the edge (``POST /v1/check``) whether this attempt may be tried at all; the answer
   is ``{"allowed": bool, "retry_after_ms": int}`` and nothing else;
2. verify exactly ONE password hash whatever happened: the account's hash if the edge
   allowed the attempt and the account exists, otherwise a dummy hash of the same cost.
   A refusal, an unknown account and a wrong password then take the same time, so the
   response time tells an attacker nothing;
3. report the attempt to ``auth.login-attempts`` (``failure_reason="refused"`` when the
   edge refused), so the pipeline keeps counting.

If the edge cannot be reached within ``EDGE_TIMEOUT_S`` the handler fails open (the
attempt is tried and still reported, so the worker keeps counting it); set
``FAIL_OPEN = False`` to refuse instead.

Only the standard library and aiohttp (for the edge) are needed; the optional report
uses aiokafka. Run the edge with ``authpipe edge serve`` next to the login service.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import secrets
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

EDGE_URL = os.environ.get("AUTHPIPE_EDGE_URL", "http://127.0.0.1:8080")
EDGE_TOKEN = os.environ.get("AUTHPIPE_EDGE_TOKEN")
EDGE_TIMEOUT_S = 0.1
FAIL_OPEN = True
SERVICE = "example-login"
SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}

log = logging.getLogger("login")


# -- password hashes ------------------------------------------------------------------


def hash_password(password: str, salt: bytes | None = None) -> str:
    """``scrypt$<salt hex>$<hash hex>`` (use argon2 or bcrypt in production if you have it)."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, **SCRYPT)
    return f"scrypt${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    _, salt_hex, digest_hex = stored.split("$")
    digest = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt_hex), **SCRYPT)
    return hmac.compare_digest(digest, bytes.fromhex(digest_hex))


# Same algorithm and cost as real hashes, of a password nobody knows.
DUMMY_HASH = hash_password(secrets.token_urlsafe(32))


# -- the edge ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """What the login service knows about one attempt."""

    account: str
    password: str
    peer_ip: str  # the TCP peer (your reverse proxy, or the client)
    forwarded_for: Sequence[str] = ()  # X-Forwarded-For, left to right
    device_id: str | None = None  # device cookie id, if any
    device_trusted: bool = False  # the cookie is verified trusted for this account
    tenant: str = "default"
    flow: str = "login"


class EdgeClient:
    """``POST /v1/check`` on the authpipe edge, with a short timeout."""

    def __init__(self, session: aiohttp.ClientSession, url: str = EDGE_URL) -> None:
        self.session = session
        self.url = url.rstrip("/") + "/v1/check"
        self.headers = {"Authorization": f"Bearer {EDGE_TOKEN}"} if EDGE_TOKEN else {}

    async def check(self, attempt: Attempt) -> tuple[bool, int]:
        """(allowed, retry_after_ms); fails open or closed per FAIL_OPEN on any error."""
        body = {
            "tenant": attempt.tenant,
            "account": attempt.account,
            "ip": attempt.peer_ip,
            "forwarded_for": list(attempt.forwarded_for),
            "device": attempt.device_id,
            "trusted": attempt.device_trusted,
            "flow": attempt.flow,
        }
        try:
            async with asyncio.timeout(EDGE_TIMEOUT_S):
                async with self.session.post(self.url, json=body, headers=self.headers) as resp:
                    resp.raise_for_status()
                    answer = await resp.json()
            return bool(answer["allowed"]), int(answer["retry_after_ms"])
        except (aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            log.warning(
                "edge check failed (%s); failing %s", exc, "open" if FAIL_OPEN else "closed"
            )
            return FAIL_OPEN, 0


# -- the handler ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoginResult:
    ok: bool
    retry_after_ms: int  # > 0 when the edge refused: a Retry-After for the client


Report = Callable[[dict[str, Any]], Awaitable[None]]


async def login(
    attempt: Attempt,
    edge: EdgeClient,
    password_hashes: Mapping[str, str],
    report: Report | None = None,
) -> LoginResult:
    """Check at the edge, verify exactly one hash, report the attempt."""
    allowed, retry_after_ms = await edge.check(attempt)
    stored = password_hashes.get(attempt.account) if allowed else None
    # One scrypt either way, off the event loop: the account's hash, or the dummy one.
    matches = await asyncio.to_thread(verify_password, attempt.password, stored or DUMMY_HASH)
    ok = allowed and stored is not None and matches
    if not allowed:
        reason: str | None = "refused"
    elif stored is None:
        reason = "unknown_account"
    else:
        reason = None if ok else "bad_password"
    if report is not None:
        await report(attempt_event(attempt, ok, reason))
    return LoginResult(ok, 0 if allowed else retry_after_ms)


def attempt_event(attempt: Attempt, ok: bool, failure_reason: str | None) -> dict[str, Any]:
    """The ``login_attempt`` v1 event for ``auth.login-attempts`` (never the password)."""
    now = datetime.now(UTC)
    return {
        "event_id": str(uuid.uuid4()),
        "occurred_at": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "tenant": attempt.tenant,
        "service": SERVICE,
        "flow": attempt.flow,
        "account": attempt.account,
        "peer_ip": attempt.peer_ip,
        "forwarded_for": list(attempt.forwarded_for),
        "device_id": attempt.device_id,
        "device_trusted": attempt.device_trusted,
        "outcome": "success" if ok else "failure",
        "failure_reason": failure_reason,
    }


def kafka_report(producer: Any, topic: str = "auth.login-attempts") -> Report:
    """A ``report`` that sends events with an ``aiokafka.AIOKafkaProducer``."""
    import json

    async def send(event: dict[str, Any]) -> None:
        await producer.send(topic, json.dumps(event).encode())

    return send


async def main() -> None:
    """Try one login from the command line against a running edge."""
    users = {"alice@example.com": hash_password("correct horse battery staple")}
    async with aiohttp.ClientSession() as session:
        edge = EdgeClient(session)
        attempt = Attempt("alice@example.com", "guess", peer_ip="203.0.113.9")
        print(await login(attempt, edge, users))


if __name__ == "__main__":
    asyncio.run(main())
