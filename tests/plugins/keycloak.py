"""Keycloak fixtures (issue 47): one real Keycloak with authpipe's provider per test session,
against the session's broker and a real ``authpipe edge serve``.

The dist and its optimized build come from ``scripts/keycloak-setup`` (a cache outside the
clone). The instance's home (its H2 database) lives in ``.state/keycloak-test/<realm hash>``
and is kept between sessions, so only the first session imports the realm (about 45 s on 2
cores); later ones start in about 10 s. A session that cannot take the home's lock (another
session runs) uses a fresh temporary home. Keycloak that cannot start fails the tests with
the tail of its log; nothing is skipped.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.dev.keycloak import REALM_FILE, LocalKeycloak, ProviderConfig
from pipeline.dev.mailsink import MailSink
from pipeline.errors import AuthpipeError
from tests.integration.edge_process import TOKEN, edge_serving
from tests.plugins.kafka import REPO_ROOT, free_port_pair, free_ports
from tests.unit.test_edge_support import DIGEST_KEY

TEST_HOME_BASE = REPO_ROOT / ".state" / "keycloak-test"
CAPTCHA_KEY = "authpipe-test-altcha-hmac-key-0123456789abcdef"


@dataclass(frozen=True)
class KeycloakStack:
    """The session's Keycloak (``url``, realm ``authpipe``), the edge it asks (``edge_url``),
    the topics it publishes to and the edge reads decisions from, and the mail sink that is
    the realm's SMTP server (``mail``: what the step-up mails)."""

    url: str
    edge_url: str
    bootstrap: str
    attempts_topic: str
    decisions_topic: str
    keycloak: LocalKeycloak
    mail: MailSink

    @property
    def token_url(self) -> str:
        return f"{self.url}/realms/authpipe/protocol/openid-connect/token"


def _create_topics(bootstrap: str, names: list[str]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(n, 1, 1) for n in names])
        finally:
            await admin.close()

    asyncio.run(run())


def _edge_config(path: Path, bootstrap: str, decisions_topic: str) -> Path:
    path.write_text(
        f'[kafka]\nbootstrap_servers = "{bootstrap}"\ndecisions_topic = "{decisions_topic}"\n'
        f'[identity]\ndigest_key = "{DIGEST_KEY}"\n'
        '[ingest]\ntrusted_proxies = ["127.0.0.0/8"]\n'
        f'[edge]\ntoken = "{TOKEN}"\n[log]\nformat = "json"\n'
    )
    return path


def _started(home: Path, provider: ProviderConfig, edge_port: int) -> LocalKeycloak:
    """Keycloak on a pair of free ports (it takes the port and the next for management),
    up to three pairs tried: a port free when chosen can still be taken before Keycloak
    binds it."""
    for attempt in range(3):
        kc_port, _ = free_port_pair()
        if edge_port in (kc_port, kc_port + 1):
            continue
        keycloak = LocalKeycloak(home, kc_port, provider)
        keycloak.down()  # an instance a killed session left behind in this home
        try:
            keycloak.up()
            return keycloak
        except AuthpipeError as exc:
            keycloak.down()
            if attempt < 2:
                continue
            pytest.fail(
                f"Keycloak with authpipe's provider did not start: {exc}\n"
                "Run `bash scripts/keycloak-setup` (Java 17+ and Maven) and retry.",
                pytrace=False,
            )
    pytest.fail("no free port pair for Keycloak in three tries", pytrace=False)


@pytest.fixture(scope="session")
def keycloak_stack(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeycloakStack]:
    """Keycloak + provider + edge + topics for the session."""
    base = tmp_path_factory.mktemp("keycloak")
    attempts, decisions = (
        f"kc-{kind}-{uuid.uuid4().hex[:8]}" for kind in ("attempts", "decisions")
    )
    _create_topics(kafka_bootstrap, [attempts, decisions])
    (edge_port,) = free_ports(1)
    config = _edge_config(base / "edge.toml", kafka_bootstrap, decisions)
    realm_hash = hashlib.sha256(REALM_FILE.read_bytes()).hexdigest()[:12]
    home = TEST_HOME_BASE / realm_hash
    home.mkdir(parents=True, exist_ok=True)
    lock = (home / ".lock").open("a")
    temporary = False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        home, temporary = Path(tempfile.mkdtemp(prefix="authpipe-kc-")), True
    with edge_serving(config, edge_port, base / "edge.log") as edge_url, MailSink() as mail:
        provider = ProviderConfig(
            kafka_bootstrap,
            edge_url,
            edge_token=TOKEN,
            topic=attempts,
            timeout_ms=1000,
            captcha_key=CAPTCHA_KEY,
        )
        keycloak = _started(home, provider, edge_port)
        try:
            keycloak.point_smtp_at(mail.port)
        except AuthpipeError as exc:
            keycloak.down()
            pytest.fail(f"Keycloak's SMTP setting was refused: {exc}", pytrace=False)
        try:
            yield KeycloakStack(
                keycloak.url, edge_url, kafka_bootstrap, attempts, decisions, keycloak, mail
            )
        finally:
            keycloak.down()
            lock.close()
            if temporary:
                shutil.rmtree(home, ignore_errors=True)
