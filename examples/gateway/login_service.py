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

The owner's way out (seed 001's unlock mail): when an untrusted lock trips on an account
(the consecutive-failure lock, the ceiling, the lifetime bound), the worker publishes at
most one notice per account per window to ``auth.account-notices``. It names the account
only by its keyed digest; ``NoticeMailer`` maps the digest back through the service's own
accounts (``account_digest``, with the digest key shared with authpipe) and mails the
owner a sign-in link that, on success, trusts the device (then the lock never applies to
it). ``consume_notices`` runs it over the topic; here it prints what it would send.

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
from collections import OrderedDict
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
# The account-digest secret shared with authpipe (``identity.digest_key``; the local stack
# writes it to ``.state/digest.key``). Needed only to map notices back to accounts.
DIGEST_KEY = os.environ.get("AUTHPIPE_IDENTITY_DIGEST_KEY", "")
NOTICES_TOPIC = os.environ.get("AUTHPIPE_KAFKA_NOTICES_TOPIC", "auth.account-notices")
BOOTSTRAP = os.environ.get("AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")

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


# -- the owner's way out: notices from auth.account-notices ---------------------------------


def account_digest(tenant: str, account: str, key: str = DIGEST_KEY) -> str:
    """authpipe's keyed account digest: BLAKE2b-128 over the NFKC, trimmed, case-folded
    account (for a tenant that is not case-sensitive), with the shared digest key."""
    import unicodedata

    if not key:
        raise ValueError("set AUTHPIPE_IDENTITY_DIGEST_KEY to authpipe's identity.digest_key")
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", account).strip().casefold())
    raw = key.encode()
    h = hashlib.blake2b(digest_size=16, key=raw if len(raw) <= 64 else hashlib.blake2b(raw).digest())
    for part in (b"acct\x00", tenant.encode(), b"\x00", text.encode("utf-8", "surrogatepass")):
        h.update(part)
    return h.hexdigest()


Mailer = Callable[[str, str, str], Awaitable[None]]


class NoticeMailer:
    """Turns a notice into the owner's unlock mail: at most one per notice. The worker
    sends at most one notice per account per window, but delivery is at least once: a
    worker restarted after a crash can send a notice again, with the same ``notice_id``.
    The last ``remember`` ids mailed are kept, so a copy is not mailed twice (a service
    with several instances would keep them in its database)."""

    def __init__(
        self, accounts: Mapping[tuple[str, str], str], send: Mailer, remember: int = 100_000
    ) -> None:
        # (tenant, digest) -> the account's mail address, from the service's own records.
        self.accounts = accounts
        self.send = send
        self.remember = remember
        self.mailed: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def for_users(
        cls, tenant: str, users: Sequence[str], send: Mailer, key: str = DIGEST_KEY
    ) -> NoticeMailer:
        return cls({(tenant, account_digest(tenant, u, key)): u for u in users}, send)

    async def handle(self, notice: Mapping[str, Any]) -> bool:
        """Mail the owner; False when the digest is not one of ours (an unknown account:
        the pipeline counts those too, and there is nobody to tell) or the notice was
        mailed already (a copy re-sent after a worker's restart)."""
        address = self.accounts.get((notice["tenant"], notice["account_digest"]))
        if address is None or notice["notice_id"] in self.mailed:
            return False
        link = f"https://login.example/unlock?t={secrets.token_urlsafe(24)}"
        body = (
            f"Someone failed to sign in to your account many times ({notice['reason']}); "
            f"sign-ins from new devices are paused until {notice['expires_at']}. If it was "
            f"you, this link signs you in and remembers this device: {link}"
        )
        await self.send(address, "Unusual sign-in attempts on your account", body)
        self.mailed[notice["notice_id"]] = None
        if len(self.mailed) > self.remember:
            self.mailed.popitem(last=False)
        return True


async def print_mail(to: str, subject: str, body: str) -> None:
    print(f"would mail {to}: {subject}\n  {body}")


async def consume_notices(consumer: Any, mailer: NoticeMailer) -> None:
    """Run ``mailer`` over an ``aiokafka.AIOKafkaConsumer`` subscribed to the notices topic."""
    import json

    async for message in consumer:
        try:
            notice = json.loads(message.value)
        except ValueError:
            log.warning("skipping a notice that is not JSON at offset %s", message.offset)
            continue
        await mailer.handle(notice)


async def main() -> None:
    """Try one login from the command line against a running edge."""
    users = {"alice@example.com": hash_password("correct horse battery staple")}
    async with aiohttp.ClientSession() as session:
        edge = EdgeClient(session)
        attempt = Attempt("alice@example.com", "guess", peer_ip="203.0.113.9")
        print(await login(attempt, edge, users))


async def notices_main(users: Sequence[str]) -> None:
    """Print the unlock mail for every notice on the topic about one of ``users``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        NOTICES_TOPIC, bootstrap_servers=BOOTSTRAP, group_id=f"{SERVICE}-notices",
        auto_offset_reset="earliest",
    )  # fmt: skip
    await consumer.start()
    try:
        await consume_notices(consumer, NoticeMailer.for_users("default", users, print_mail))
    finally:
        await consumer.stop()


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["notices"]:  # login_service.py notices alice@example.com ...
        asyncio.run(notices_main(sys.argv[2:]))
    else:
        asyncio.run(main())
