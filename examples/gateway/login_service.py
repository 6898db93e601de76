"""A login handler that asks the authpipe edge before it verifies a password.

The flow of one attempt:

1. ask the edge (``POST /v1/check``) whether this attempt may be tried at all; the answer
   is ``{"allowed": bool, "retry_after_ms": int, "challenge": "captcha"|"step_up"|null,
   "step_up": bool}`` (``challenge`` and ``step_up`` may be absent: an older edge). It is read defensively (``read_answer``):
   anything but a JSON object with a boolean ``allowed`` is an edge failure;
2. ``challenge == "captcha"``: before the password is looked at, the client must answer a
   CAPTCHA (``CaptchaVerifier``): ``AltchaCaptcha``, a self-hosted proof of work (ALTCHA),
   whose widget ``login_app``'s page serves from a local file (``scripts/altcha-widget``)
   and whose payload is verified here (signature, expiry, work, single use). No
   answer yet: the demand goes back and nothing is reported. An answer is reported as an
   event with ``flow="challenge"``, ``challenge="captcha"`` and its outcome; a failed one
   ends the attempt there (the password is never checked, so the answer says nothing
   about the account);
3. verify exactly ONE password hash: the account's hash if the edge allowed the attempt
   and the account exists, otherwise a dummy hash of the same cost. A refusal, an
   unknown account and a wrong password then take the same time, so the response time
   tells an attacker nothing;
4. report the attempt to ``auth.login-attempts`` (``failure_reason="refused"`` when the
   edge refused), so the pipeline keeps counting;
5. ``step_up`` (or ``challenge == "step_up"``) and the password was right from a device
   that is not trusted: the login is not complete, and the right password is reported as
   ``outcome="step_up"``, not as a sign-in (so it makes nothing familiar and ends no lock
   run). ``StepUps`` mails a one-time code bound to the account and the device and
   returns a ticket; ``finish_step_up`` checks the code (one try per ticket, 10
   minutes), asking the edge first with ``flow="mfa"``, and reports the outcome as a
   ``flow="mfa"`` event (``bad_second_factor`` when wrong); when it passed, the completed
   sign-in follows as a ``success`` of the original flow with ``challenge="step_up"``.

6. the session review (a wave's lead-in): a session signed in from a device that is not
   trusted without any challenge is young for ``REVIEW_S`` (10 minutes). On each of its
   requests while young, ``review_session`` asks the edge (``GET /v1/session`` with the
   sign-in time): ``{"challenge": "step_up"}`` means a stuffing wave detected after the
   sign-in was already running at it, so the session is suspended until a step-up
   (``StepUps``, ``finish_step_up``) passes. An unreachable edge lets the request go on.

If the edge cannot be reached within ``EDGE_TIMEOUT_S`` the handler fails open (the
attempt is tried and still reported, so the worker keeps counting it); set
``FAIL_OPEN = False`` to refuse instead.

The owner's way out (seed 001's unlock mail): when an untrusted lock trips on an account
(the consecutive-failure lock, the ceiling, the lifetime bound), the worker publishes at
most one notice per account per window to ``auth.account-notices``. It names the account
only by its keyed digest; ``NoticeMailer`` maps the digest back through the service's own
accounts, digested by authpipe's own Normaliser (``pipeline.wiring.build_normaliser``:
the same ignorable-character strip, NFKC, case folding and case-sensitive tenants as the
worker, with the digest key shared with authpipe), and mails the owner a sign-in link
(``UnlockLinks``): single-use, valid ``UNLOCK_TTL_S`` (15 minutes), for that account only,
and it trusts exactly the one device that redeems it (then the lock never applies to it).
``consume_notices`` runs it over the topic with the same TLS/SASL client options as
every authpipe client (``pipeline.kafka_client.client_kwargs``); a malformed notice, or a
mail that cannot be sent, is logged and skipped, never stops the mail of the others. Here
it prints what it would send.

The login handler needs only the standard library, aiohttp (the edge, the page) and
``altcha`` (the CAPTCHA's challenges and their check); ``python login_service.py serve``
runs the page on 127.0.0.1:8000 (``AUTHPIPE_ALTCHA_HMAC_KEY`` must be set). The notice
consumer also uses authpipe itself (the Normaliser and the Kafka options) and aiokafka.
Run the edge with ``authpipe edge serve`` next to the login service.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import html
import json
import logging
import os
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import altcha
from aiohttp import web

if TYPE_CHECKING:
    from pipeline.core.attempt import Normaliser

EDGE_URL = os.environ.get("AUTHPIPE_EDGE_URL", "http://127.0.0.1:8080")
EDGE_TOKEN = os.environ.get("AUTHPIPE_EDGE_TOKEN")
EDGE_TIMEOUT_S = 0.1
FAIL_OPEN = True
SERVICE = "example-login"
SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
CHALLENGES = ("captcha", "step_up")
UNLOCK_TTL_S = 15 * 60
STEP_UP_TTL_S = 10 * 60
REVIEW_S = (
    10 * 60
)  # a session signed in unchallenged from an untrusted device is reviewed this long
NOTICES_TOPIC = os.environ.get("AUTHPIPE_KAFKA_NOTICES_TOPIC", "auth.account-notices")

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


# -- one-time secrets: unlock links and step-up codes ----------------------------------


def _sha256(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class OneTimeSecrets:
    """Secrets that are single-use, short-lived and bound to a subject (a tuple such as
    (tenant, account, device)). Only their SHA-256 is kept, at most ``max_entries`` (the
    oldest go first); a service with several instances keeps them in its database."""

    def __init__(
        self, ttl_s: float, clock: Callable[[], float] = time.time, max_entries: int = 100_000
    ) -> None:
        self.ttl_s, self.clock, self.max_entries = ttl_s, clock, max_entries
        self._live: OrderedDict[bytes, tuple[tuple[str, ...], float, bytes]] = OrderedDict()

    def issue(self, subject: tuple[str, ...], proof: str = "") -> str:
        """A new secret for ``subject``; redeeming it later also needs ``proof`` (e.g. the
        code mailed beside a ticket)."""
        secret = secrets.token_urlsafe(32)
        self._live[_sha256(secret)] = (subject, self.clock() + self.ttl_s, _sha256(proof))
        while len(self._live) > self.max_entries:
            self._live.popitem(last=False)
        return secret

    def redeem(self, secret: str, subject: tuple[str, ...], proof: str = "") -> bool:
        """True once: for the subject it was issued for, with its proof, before it expires.
        Any attempt, right or wrong, uses it up (a guessed code gets one try)."""
        entry = self._live.pop(_sha256(secret), None)
        if entry is None:
            return False
        issued_for, expires, proof_hash = entry
        return (
            self.clock() < expires
            and len(issued_for) == len(subject)
            and all(hmac.compare_digest(a, b) for a, b in zip(issued_for, subject, strict=True))
            and hmac.compare_digest(proof_hash, _sha256(proof))
        )


class UnlockLinks:
    """The owner's unlock links: one per mail, for one account, single-use, valid
    ``UNLOCK_TTL_S``; the device that redeems it is the one trusted afterwards (the link
    cannot be used again, on that device or another)."""

    def __init__(self, ttl_s: float = UNLOCK_TTL_S, clock: Callable[[], float] = time.time) -> None:
        self.tokens = OneTimeSecrets(ttl_s, clock)
        self.trusted: set[tuple[str, str, str]] = set()  # (tenant, account, device id)

    def link(self, tenant: str, account: str) -> str:
        return f"https://login.example/unlock?t={self.tokens.issue((tenant, account))}"

    def redeem(self, token: str, tenant: str, account: str, device_id: str) -> bool:
        """Sign the owner in and trust ``device_id`` for the account, once."""
        if not device_id or not self.tokens.redeem(token, (tenant, account)):
            return False
        self.trusted.add((tenant, account, device_id))
        return True


class CaptchaVerifier(Protocol):
    async def verify(self, response: str, peer_ip: str) -> bool: ...


class StubCaptcha:
    """A stand-in CAPTCHA for tests that are about the flow, not the puzzle (``AltchaCaptcha``
    is the real one): it accepts the tokens it issued itself, once each."""

    def __init__(self) -> None:
        self.tokens = OneTimeSecrets(STEP_UP_TTL_S)

    def solved(self, peer_ip: str) -> str:
        """What a client that solved the stub's puzzle would send (tests and demos)."""
        return self.tokens.issue((peer_ip,))

    async def verify(self, response: str, peer_ip: str) -> bool:
        return self.tokens.redeem(response, (peer_ip,))


# -- the real CAPTCHA: ALTCHA, a proof of work, self-hosted (issue 47) --------------------

ALTCHA_KEY_ENV = "AUTHPIPE_ALTCHA_HMAC_KEY"  # signs the challenges; the same on every instance
ALTCHA_MIN_KEY_BYTES = 32
ALTCHA_ALGORITHM = "PBKDF2/SHA-256"  # ALTCHA's default; WebCrypto in the browser
ALTCHA_COST = 5_000  # PBKDF2 iterations per try
ALTCHA_KEY_PREFIX = "00"  # a try succeeds with probability 1/256: 256 tries on average
ALTCHA_TTL_S = 10 * 60
ALTCHA_MAX_PAYLOAD = 4_096  # characters of base64; the widget's is about 600
ALTCHA_WIDGET_ENV = "AUTHPIPE_ALTCHA_WIDGET_JS"
ALTCHA_WIDGET_JS = Path(__file__).resolve().parents[2] / ".state" / "altcha" / "altcha.min.js"
ALTCHA_FIELD = "altcha"  # the form field the widget fills with its payload
# What AltchaCaptcha.check answers: "ok", or why the payload is refused.
ALTCHA_VERDICTS = ("ok", "malformed", "expired", "bad_signature", "bad_solution", "replayed")


class CaptchaConfigError(ValueError):
    """The CAPTCHA cannot run as configured (a missing or short key, no widget file)."""


def altcha_key(env: Mapping[str, str] = os.environ) -> bytes:
    """The challenges' HMAC key from ``AUTHPIPE_ALTCHA_HMAC_KEY``; raises CaptchaConfigError
    when it is missing or shorter than ``ALTCHA_MIN_KEY_BYTES``."""
    value = env.get(ALTCHA_KEY_ENV, "")
    if not value:
        raise CaptchaConfigError(
            f"{ALTCHA_KEY_ENV} is not set: the login service signs its CAPTCHA challenges "
            f"with it; set it to a random secret of at least {ALTCHA_MIN_KEY_BYTES} bytes, the "
            "same on every instance (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return _checked_key(value.encode())


def _checked_key(key: bytes) -> bytes:
    if len(key) < ALTCHA_MIN_KEY_BYTES:
        raise CaptchaConfigError(
            f"the ALTCHA HMAC key ({ALTCHA_KEY_ENV}) is {len(key)} bytes: a key that short "
            f"can be guessed and challenges forged; use at least {ALTCHA_MIN_KEY_BYTES} random "
            "bytes (python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return key


def altcha_widget_js(env: Mapping[str, str] = os.environ) -> Path:
    """The widget's script, served by the login service itself (no CDN): the file
    ``scripts/altcha-widget`` vendors from npm, or ``AUTHPIPE_ALTCHA_WIDGET_JS``."""
    path = Path(env.get(ALTCHA_WIDGET_ENV) or ALTCHA_WIDGET_JS)
    if not path.is_file():
        raise CaptchaConfigError(
            f"the ALTCHA widget {path} is missing: run scripts/altcha-widget (it vendors the "
            f"pinned npm package), or point {ALTCHA_WIDGET_ENV} at altcha.min.js"
        )
    return path


class AltchaCaptcha:
    """ALTCHA (proof of work, PoW v2 of the ``altcha`` package): ``challenge_json`` signs a
    new challenge (HMAC-SHA-256 over its parameters, expiry included); ``check`` verifies
    the widget's payload: the signature, the expiry, the work, and that no payload of the
    same challenge was accepted before (single use). A solved challenge is a cost paid,
    bound to no account or address: a bot with CPU pays it too (docs/policy.md).

    The challenges accepted are remembered until they expire, at most ``max_entries`` (the
    oldest go first); a service with several instances keeps them in a shared store."""

    def __init__(
        self,
        hmac_key: bytes | str,
        *,
        cost: int = ALTCHA_COST,
        key_prefix: str = ALTCHA_KEY_PREFIX,
        ttl_s: int = ALTCHA_TTL_S,
        clock: Callable[[], float] = time.time,
        max_entries: int = 100_000,
    ) -> None:
        key = hmac_key.encode() if isinstance(hmac_key, str) else hmac_key
        self.key = _checked_key(key)
        self.cost, self.key_prefix, self.ttl_s = cost, key_prefix, ttl_s
        self.clock, self.max_entries = clock, max_entries
        self._used: OrderedDict[str, int] = OrderedDict()  # signature -> expires (epoch s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AltchaCaptcha:
        return cls(altcha_key(env))

    def challenge(self) -> dict[str, Any]:
        """A new signed challenge, as the widget reads it."""
        made = altcha.create_challenge(
            ALTCHA_ALGORITHM,
            self.cost,
            key_prefix=self.key_prefix,
            expires_at=int(self.clock()) + self.ttl_s,
            hmac_secret=self.key,
        )
        return dict(made.to_dict())

    def challenge_json(self) -> str:
        return json.dumps(self.challenge(), separators=(",", ":"))

    def check(self, payload: object) -> str:
        """``"ok"`` once per solved challenge, else the reason (``ALTCHA_VERDICTS``). Never
        raises for what a client sent."""
        parsed = _altcha_payload(payload)
        if parsed is None:
            return "malformed"
        expires = parsed.challenge.parameters.expires_at
        if type(expires) is not int:  # every challenge this service signs expires
            return "malformed"
        now = self.clock()
        if expires <= now:
            return "expired"
        try:
            result = altcha.verify_solution(parsed, self.key)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError):
            return "malformed"  # signed by us, so not reachable; a client never makes a 500
        if result.expired:
            return "expired"
        if result.invalid_signature or not isinstance(parsed.challenge.signature, str):
            return "bad_signature"
        if not result.verified:
            return "bad_solution"
        return self._first_use(parsed.challenge.signature, expires, now)

    def _first_use(self, signature: str, expires: int, now: float) -> str:
        while self._used and next(iter(self._used.values())) <= now:
            self._used.popitem(last=False)  # expired: refused on expiry from now on
        if signature in self._used:
            return "replayed"
        self._used[signature] = expires
        while len(self._used) > self.max_entries:
            self._used.popitem(last=False)
        return "ok"

    async def verify(self, response: str, peer_ip: str) -> bool:
        verdict = self.check(response)
        if verdict != "ok":
            log.info("ALTCHA payload from %s refused: %s", peer_ip, verdict)
        return verdict == "ok"


def _altcha_payload(payload: object) -> altcha.Payload | None:
    """The widget's base64 JSON as an ``altcha.Payload``, or None when it is not one."""
    if not isinstance(payload, str) or not 0 < len(payload) <= ALTCHA_MAX_PAYLOAD:
        return None
    try:
        data = json.loads(base64.b64decode(payload, validate=True))
        if not isinstance(data, dict):
            return None
        parsed = altcha.Payload.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return None
    return parsed


async def print_mail(to: str, subject: str, body: str) -> None:
    print(f"would mail {to}: {subject}\n  {body}")


Mailer = Callable[[str, str, str], Awaitable[None]]


class StepUps:
    """Second factors by e-mail code: ``start`` after a correct password from an untrusted
    device mails a 6-digit code and returns a ticket for the client's session; the pair
    redeems once, within ``STEP_UP_TTL_S``, for the same account and device."""

    def __init__(self, send: Mailer = print_mail, ttl_s: float = STEP_UP_TTL_S) -> None:
        self.send = send
        self.tickets = OneTimeSecrets(ttl_s)

    async def start(self, attempt: Attempt) -> str:
        code = f"{secrets.randbelow(1_000_000):06d}"
        ticket = self.tickets.issue(_subject(attempt), code)
        await self.send(attempt.account, "Your sign-in code", f"Your code is {code}.")
        return ticket

    def finish(self, attempt: Attempt, ticket: str, code: str) -> bool:
        return self.tickets.redeem(ticket, _subject(attempt), code)


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
    captcha_response: str | None = None  # the client's answer, when one was demanded


def _subject(attempt: Attempt) -> tuple[str, ...]:
    return (attempt.tenant, attempt.account, attempt.device_id or "")


@dataclass(frozen=True)
class EdgeAnswer:
    allowed: bool
    retry_after_ms: int = 0
    challenge: str | None = None  # "captcha", "step_up" or None
    step_up: bool = False  # a right password needs a possession check before a session


class EdgeError(ValueError):
    """The edge's answer is not what it sends."""


def read_answer(answer: object) -> EdgeAnswer:
    """The check's JSON, read defensively: ``allowed`` must be a boolean; a missing or bad
    ``retry_after_ms`` is 0; a missing or null ``challenge`` (an older edge) is none, an
    unknown kind (a newer edge) is a CAPTCHA, the challenge every client can answer; a
    missing ``step_up`` is true exactly when ``challenge`` is ``step_up``."""
    if not isinstance(answer, dict) or not isinstance(answer.get("allowed"), bool):
        raise EdgeError("the edge's answer has no boolean 'allowed'")
    retry = answer.get("retry_after_ms")
    retry_ms = retry if isinstance(retry, int) and not isinstance(retry, bool) and retry > 0 else 0
    challenge = answer.get("challenge")
    if challenge is not None and challenge not in CHALLENGES:
        log.warning(
            "the edge asked for challenge %r, unknown here; asking for a CAPTCHA", challenge
        )
        challenge = "captcha"
    step_up = answer.get("step_up") is True or challenge == "step_up"
    return EdgeAnswer(answer["allowed"], retry_ms, challenge, step_up)


class EdgeClient:
    """``POST /v1/check`` and ``GET /v1/session`` on the authpipe edge, with a short
    timeout."""

    def __init__(self, session: aiohttp.ClientSession, url: str = EDGE_URL) -> None:
        self.session = session
        self.url = url.rstrip("/") + "/v1/check"
        self.session_url = url.rstrip("/") + "/v1/session"
        self.headers = {"Authorization": f"Bearer {EDGE_TOKEN}"} if EDGE_TOKEN else {}

    async def review(self, attempt: Attempt, signed_in_at_ms: int) -> str | None:
        """The step-up a young session owes (``"step_up"``) or None; None when the edge
        cannot be reached (the request goes on: the sign-in itself was allowed)."""
        query = {
            "tenant": attempt.tenant,
            "account": attempt.account,
            "ip": attempt.peer_ip,
            "signed_in_at_ms": str(signed_in_at_ms),
        }
        if attempt.forwarded_for:
            query["forwarded_for"] = ",".join(attempt.forwarded_for)
        if attempt.device_id:
            query["device"] = attempt.device_id
        try:
            async with asyncio.timeout(EDGE_TIMEOUT_S):
                async with self.session.get(
                    self.session_url, params=query, headers=self.headers
                ) as resp:
                    resp.raise_for_status()
                    answer = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("edge session review failed (%s); the request goes on", exc)
            return None
        challenge = answer.get("challenge") if isinstance(answer, dict) else None
        return "step_up" if challenge is not None else None

    async def check(self, attempt: Attempt, flow: str | None = None) -> EdgeAnswer:
        """The edge's answer; fails open or closed per FAIL_OPEN on any error."""
        body = {
            "tenant": attempt.tenant,
            "account": attempt.account,
            "ip": attempt.peer_ip,
            "forwarded_for": list(attempt.forwarded_for),
            "device": attempt.device_id,
            "trusted": attempt.device_trusted,
            "flow": flow or attempt.flow,
        }
        try:
            async with asyncio.timeout(EDGE_TIMEOUT_S):
                async with self.session.post(self.url, json=body, headers=self.headers) as resp:
                    resp.raise_for_status()
                    return read_answer(await resp.json())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning(
                "edge check failed (%s); failing %s", exc, "open" if FAIL_OPEN else "closed"
            )
            return EdgeAnswer(FAIL_OPEN)


# -- the handler ------------------------------------------------------------------------


@dataclass(frozen=True)
class LoginResult:
    ok: bool
    retry_after_ms: int  # > 0 when the edge refused: a Retry-After for the client
    challenge: str | None = None  # what the client must do next: "captcha" or "step_up"
    step_up_ticket: str | None = None  # with "step_up": the ticket finish_step_up takes
    # A sign-in from an untrusted device that met no challenge: keep it with the session
    # and call review_session on its requests for REVIEW_S.
    review_from_ms: int | None = None


Report = Callable[[dict[str, Any]], Awaitable[None]]


async def _report(report: Report | None, event: dict[str, Any]) -> None:
    if report is not None:
        await report(event)


async def login(
    attempt: Attempt,
    edge: EdgeClient,
    password_hashes: Mapping[str, str],
    report: Report | None = None,
    *,
    captcha: CaptchaVerifier | None = None,
    step_ups: StepUps | None = None,
) -> LoginResult:
    """Check at the edge, answer its challenge, verify exactly one hash, report."""
    answer = await edge.check(attempt)
    if answer.allowed and answer.challenge == "captcha":
        if attempt.captcha_response is None:
            return LoginResult(False, 0, "captcha")  # ask first; nothing was tried yet
        passed = captcha is not None and await captcha.verify(
            attempt.captcha_response, attempt.peer_ip
        )
        if captcha is None:
            log.warning("the edge asked for a CAPTCHA and no verifier is configured")
        await _report(
            report,
            attempt_event(
                attempt, passed, None if passed else "other", flow="challenge", challenge="captcha"
            ),
        )
        if not passed:
            return LoginResult(False, 0, "captcha")
    stored = password_hashes.get(attempt.account) if answer.allowed else None
    # One scrypt either way, off the event loop: the account's hash, or the dummy one.
    matches = await asyncio.to_thread(verify_password, attempt.password, stored or DUMMY_HASH)
    ok = answer.allowed and stored is not None and matches
    if not answer.allowed:
        reason: str | None = "refused"
    elif stored is None:
        reason = "unknown_account"
    else:
        reason = None if ok else "bad_password"
    step_up = ok and answer.step_up and not attempt.device_trusted
    # A right password answered by a step-up is not a sign-in (issue 44): reported as such.
    await _report(
        report, attempt_event(attempt, ok, reason, outcome="step_up" if step_up else None)
    )
    if step_up:
        if step_ups is None:
            log.warning("the edge asked for a second factor and no StepUps is configured")
            return LoginResult(False, 0, "step_up")
        return LoginResult(False, 0, "step_up", await step_ups.start(attempt))
    unchallenged = ok and answer.challenge is None and not attempt.device_trusted
    review_from = int(time.time() * 1000) if unchallenged else None
    return LoginResult(ok, 0 if answer.allowed else answer.retry_after_ms, None, None, review_from)


async def review_session(
    attempt: Attempt,
    signed_in: LoginResult,
    edge: EdgeClient,
    step_ups: StepUps | None,
    now_s: Callable[[], float] = time.time,
) -> LoginResult | None:
    """On a request of the session ``signed_in`` opened (``login``'s result for
    ``attempt``): None lets the request go on; a ``step_up`` result (with a ticket for
    ``finish_step_up``) suspends the session until the second factor passes. Only a
    session with ``review_from_ms`` younger than ``REVIEW_S`` is asked about."""
    since = signed_in.review_from_ms
    if since is None or now_s() * 1000 - since > REVIEW_S * 1000:
        return None
    if await edge.review(attempt, since) is None:
        return None
    if step_ups is None:
        log.warning("the edge asked a session for a second factor and no StepUps is configured")
        return LoginResult(False, 0, "step_up")
    return LoginResult(False, 0, "step_up", await step_ups.start(attempt))


async def finish_step_up(
    attempt: Attempt,
    ticket: str,
    code: str,
    edge: EdgeClient,
    step_ups: StepUps,
    report: Report | None = None,
) -> LoginResult:
    """The second step of a ``step_up``: ask the edge (``flow="mfa"``: the second factor
    has its own limits), check the code against the ticket (once), report the outcome as
    a ``flow="mfa"`` event."""
    answer = await edge.check(attempt, flow="mfa")
    ok = step_ups.finish(attempt, ticket, code)  # used up either way
    if not answer.allowed:
        ok, reason = False, "refused"
    else:
        reason = None if ok else "bad_second_factor"
    await _report(report, attempt_event(attempt, ok, reason, flow="mfa"))
    if ok:  # the completed sign-in: only now is it one (familiar place, end of a lock run)
        await _report(report, attempt_event(attempt, True, None, challenge="step_up"))
    return LoginResult(ok, 0 if answer.allowed else answer.retry_after_ms)


def attempt_event(
    attempt: Attempt,
    ok: bool,
    failure_reason: str | None,
    *,
    flow: str | None = None,
    challenge: str | None = None,
    outcome: str | None = None,
) -> dict[str, Any]:
    """The ``login_attempt`` v1 event for ``auth.login-attempts`` (never the password);
    ``outcome`` overrides the one ``ok`` gives (``step_up``)."""
    now = datetime.now(UTC)
    event = {
        "event_id": str(uuid.uuid4()),
        "occurred_at": now.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "tenant": attempt.tenant,
        "service": SERVICE,
        "flow": flow or attempt.flow,
        "account": attempt.account,
        "peer_ip": attempt.peer_ip,
        "forwarded_for": list(attempt.forwarded_for),
        "device_id": attempt.device_id,
        "device_trusted": attempt.device_trusted,
        "outcome": outcome or ("success" if ok else "failure"),
        "failure_reason": failure_reason,
    }
    if challenge is not None:
        event["challenge"] = challenge
    return event


def kafka_report(producer: Any, topic: str = "auth.login-attempts") -> Report:
    """A ``report`` that sends events with an ``aiokafka.AIOKafkaProducer``."""

    async def send(event: dict[str, Any]) -> None:
        await producer.send(topic, json.dumps(event).encode())

    return send


# -- the login page: a form, and the ALTCHA widget when the edge asks for a CAPTCHA ------

# The page loads scripts from this service only (the widget runs its proof of work in
# workers it starts from data: URLs, and injects its own styles).
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; worker-src 'self' data: blob:; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def login_page(account: str = "", challenge_json: str | None = None, message: str = "") -> str:
    """The sign-in form; with ``challenge_json`` the ALTCHA widget solves that challenge
    as the page loads and puts its payload in the form's ``altcha`` field."""
    widget = ""
    if challenge_json is not None:
        widget = (
            '<script type="module" src="/altcha/altcha.min.js"></script>\n'
            f'<altcha-widget name="{ALTCHA_FIELD}" auto="onload" '
            f'challenge="{html.escape(challenge_json)}"></altcha-widget>\n'
        )
    note = f'<p role="alert" data-message="1">{html.escape(message)}</p>\n' if message else ""
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>Sign in</title>'
        '</head><body>\n<form method="post" action="/login" id="login">\n'
        f"{note}"
        '<label>Account <input name="account" autocomplete="username" '
        f'value="{html.escape(account)}"></label>\n'
        '<label>Password <input name="password" type="password" '
        'autocomplete="current-password"></label>\n'
        f"{widget}"
        '<button type="submit">Sign in</button>\n</form>\n</body></html>\n'
    )


_EDGE_SESSION = web.AppKey("edge_session", aiohttp.ClientSession)


def _page(body: str, status: int = 200, **headers: str) -> web.Response:
    headers = {"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-store", **headers}
    return web.Response(text=body, status=status, content_type="text/html", headers=headers)


def login_app(
    edge_url: str,
    password_hashes: Mapping[str, str],
    captcha: AltchaCaptcha,
    report: Report | None = None,
    step_ups: StepUps | None = None,
    widget_js: Path | None = None,
) -> web.Application:
    """``GET /login`` the form; ``POST /login`` one attempt through ``login`` (the edge,
    the CAPTCHA when it asks for one, one hash, the events); ``GET /altcha/altcha.min.js``
    the widget, from a local file (``altcha_widget_js``)."""
    script = widget_js or altcha_widget_js()
    app = web.Application()

    async def on_startup(app: web.Application) -> None:
        app[_EDGE_SESSION] = aiohttp.ClientSession()

    async def on_cleanup(app: web.Application) -> None:
        await app[_EDGE_SESSION].close()

    async def form(request: web.Request) -> web.Response:
        return _page(login_page())

    async def widget(request: web.Request) -> web.FileResponse:
        return web.FileResponse(
            script,
            headers={"Content-Type": "text/javascript", "Cache-Control": "max-age=3600"},
        )

    async def submit(request: web.Request) -> web.Response:
        posted = await request.post()
        account, password = str(posted.get("account", "")), str(posted.get("password", ""))
        answer = str(posted.get(ALTCHA_FIELD, "")) or None  # an unsolved widget posts ""
        attempt = Attempt(account, password, request.remote or "", captcha_response=answer)
        result = await login(
            attempt,
            EdgeClient(request.app[_EDGE_SESSION], edge_url),
            password_hashes,
            report,
            captcha=captcha,
            step_ups=step_ups,
        )
        if result.ok:
            return _page(f'<p data-result="signed-in">Signed in as {html.escape(account)}.</p>')
        if result.challenge == "captcha":
            message = "The check did not pass: it runs again, then sign in." if answer else ""
            page = login_page(account, captcha.challenge_json(), message)
            return _page(page, 403 if answer else 401)
        if result.challenge == "step_up":
            return _page('<p data-result="step-up">We mailed you a code.</p>', 401)
        if result.retry_after_ms:
            retry = str(-(-result.retry_after_ms // 1000))
            return _page(
                login_page(account, None, "Too many attempts."), 429, **{"Retry-After": retry}
            )
        return _page(login_page(account, None, "Wrong account or password."), 401)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_get("/login", form)
    app.router.add_post("/login", submit)
    app.router.add_get("/altcha/altcha.min.js", widget)
    return app


# -- the owner's way out: notices from auth.account-notices ---------------------------------


def authpipe_normaliser() -> Normaliser:
    """authpipe's own Normaliser from its settings (``AUTHPIPE_*``, ``authpipe.toml``): the
    digest key, ``ingest.case_sensitive_tenants`` and the policy's case-sensitive tenants,
    exactly as the worker builds it."""
    from pipeline.settings import load_settings
    from pipeline.wiring import build_normaliser

    return build_normaliser(load_settings())


class BadNotice(ValueError):
    """A notice that is not one: skipped, never mailed."""


_NOTICE_TEXT = ("notice_id", "tenant", "account_digest", "reason", "expires_at")


def parse_notice(raw: bytes | None) -> dict[str, Any]:
    """A notice's JSON with its text fields checked; raises BadNotice."""
    try:
        notice = json.loads(raw or b"")
    except ValueError:
        raise BadNotice("not JSON") from None
    if not isinstance(notice, dict):
        raise BadNotice("not a JSON object")
    bad = [name for name in _NOTICE_TEXT if not isinstance(notice.get(name), str)]
    if bad:
        raise BadNotice("missing or not text: " + ", ".join(bad))
    return notice


class NoticeMailer:
    """Turns a notice into the owner's unlock mail: at most one per notice. The worker
    sends at most one notice per account per window, but delivery is at least once: a
    worker restarted after a crash can send a notice again, with the same ``notice_id``.
    The last ``remember`` ids mailed are kept, so a copy is not mailed twice (a service
    with several instances would keep them in its database)."""

    def __init__(
        self,
        accounts: Mapping[tuple[str, str], str],
        send: Mailer,
        links: UnlockLinks | None = None,
        remember: int = 100_000,
    ) -> None:
        # (tenant, digest) -> the account (its mail address), from the service's own records.
        self.accounts = accounts
        self.send = send
        self.links = links or UnlockLinks()
        self.remember = remember
        self.mailed: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def for_users(
        cls,
        tenant: str,
        users: Sequence[str],
        send: Mailer,
        normaliser: Normaliser,
        links: UnlockLinks | None = None,
    ) -> NoticeMailer:
        """A mailer for ``users`` of ``tenant``, digested by authpipe's ``normaliser``."""
        digest = normaliser.account_digest
        return cls({(tenant, digest(tenant, user)): user for user in users}, send, links)

    async def handle(self, notice: Mapping[str, Any]) -> bool:
        """Mail the owner; False when the digest is not one of ours (an unknown account:
        the pipeline counts those too, and there is nobody to tell) or the notice was
        mailed already (a copy re-sent after a worker's restart)."""
        tenant = notice["tenant"]
        account = self.accounts.get((tenant, notice["account_digest"]))
        if account is None or notice["notice_id"] in self.mailed:
            return False
        link = self.links.link(tenant, account)
        # The lifetime bound holds until a success or a reset: its expires_at is only how
        # long the hold is published before it is renewed, no end the owner can wait for.
        until = (
            "until you sign in with this link or reset your password"
            if notice["reason"] == "lifetime_bound"
            else f"until {notice['expires_at']}"
        )
        body = (
            f"Someone failed to sign in to your account many times ({notice['reason']}); "
            f"sign-ins from new devices are paused {until}. If it was "
            f"you, this link (valid {UNLOCK_TTL_S // 60} minutes, once) signs you in and "
            f"remembers the device you open it on: {link}"
        )
        await self.send(account, "Unusual sign-in attempts on your account", body)
        self.mailed[notice["notice_id"]] = None
        if len(self.mailed) > self.remember:
            self.mailed.popitem(last=False)
        return True


async def consume_notices(consumer: Any, mailer: NoticeMailer) -> None:
    """Run ``mailer`` over an ``aiokafka.AIOKafkaConsumer`` subscribed to the notices topic.
    A malformed notice, or a mail that cannot be sent, is logged and skipped: it never
    stops the mail of the notices after it."""
    async for message in consumer:
        try:
            await mailer.handle(parse_notice(message.value))
        except BadNotice as exc:
            log.warning("skipping a bad notice at offset %s: %s", message.offset, exc)
        except Exception:  # a mail server down must not stop the other owners' mail
            log.exception("mailing the notice at offset %s failed; skipped", message.offset)


async def main() -> None:
    """Try one login from the command line against a running edge."""
    users = {"alice@example.com": hash_password("correct horse battery staple")}
    async with aiohttp.ClientSession() as session:
        edge = EdgeClient(session)
        attempt = Attempt("alice@example.com", "guess", peer_ip="203.0.113.9")
        print(await login(attempt, edge, users, captcha=StubCaptcha(), step_ups=StepUps()))


def notices_consumer() -> Any:
    """An ``AIOKafkaConsumer`` of the notices topic with authpipe's Kafka settings: the
    same bootstrap servers and TLS/SASL options as every authpipe client."""
    from aiokafka import AIOKafkaConsumer

    from pipeline.kafka_client import client_kwargs
    from pipeline.settings import load_settings

    kafka = load_settings().kafka
    return AIOKafkaConsumer(
        NOTICES_TOPIC,
        **client_kwargs(kafka),
        group_id=f"{SERVICE}-notices",
        auto_offset_reset="earliest",
    )


async def notices_main(users: Sequence[str]) -> None:
    """Print the unlock mail for every notice on the topic about one of ``users``."""
    consumer = notices_consumer()
    mailer = NoticeMailer.for_users("default", users, print_mail, authpipe_normaliser())
    await consumer.start()
    try:
        await consume_notices(consumer, mailer)
    finally:
        await consumer.stop()


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["notices"]:  # login_service.py notices alice@example.com ...
        asyncio.run(notices_main(sys.argv[2:]))
    elif sys.argv[1:2] == ["serve"]:  # the login page, alice's password as in main()
        try:
            captcha = AltchaCaptcha.from_env()
            users = {"alice@example.com": hash_password("correct horse battery staple")}
            app = login_app(EDGE_URL, users, captcha, step_ups=StepUps())
        except CaptchaConfigError as exc:
            sys.exit(f"login_service.py: {exc}")
        web.run_app(app, host="127.0.0.1", port=8000)
    else:
        asyncio.run(main())
