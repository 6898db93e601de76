"""``authpipe keycloak up|down|status``: a local Keycloak with authpipe's provider, pointed
at the settings' broker and edge, with a loopback mail sink as the realm's SMTP server
(``pipeline.dev.keycloak`` runs the instance itself)."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from pipeline.dev.keycloak import (
    ADMIN_USER,
    DEFAULT_PORT,
    KeycloakError,
    LocalKeycloak,
    ProviderConfig,
)
from pipeline.dev.mailsink import sink_process_down, sink_process_up
from pipeline.settings import Settings

LAYOUT_FILE = "keycloak.json"
EXIT_RUNNING = 0
EXIT_STOPPED = 3


def captcha_key(state_dir: Path) -> str:
    """The CAPTCHA verifier's key of this state dir, made once (kept 0600)."""
    key_path = state_dir / "captcha.key"
    if not key_path.is_file():
        state_dir.mkdir(parents=True, exist_ok=True)
        key_path.write_text(secrets.token_urlsafe(32) + "\n")
        key_path.chmod(0o600)
    return key_path.read_text().strip()


def provider_config(
    settings: Settings, captcha: str | None = None, fail_open: bool = True
) -> ProviderConfig:
    """The provider's settings from authpipe's own: the broker as every client reaches it
    (TLS/SASL included), the edge at ``edge.host``/``edge.port`` with ``edge.token``."""
    kafka = settings.kafka
    host = settings.edge.host
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    host = f"[{host}]" if ":" in host else host
    password = kafka.sasl_password.get_secret_value() if kafka.sasl_password else None
    return ProviderConfig(
        kafka.bootstrap_servers,
        f"http://{host}:{settings.edge.port}",
        edge_token=settings.edge.token,
        fail_open=fail_open,
        captcha_key=captcha,
        topic=kafka.input_topic,
        security_protocol=kafka.security_protocol,
        sasl_mechanism=kafka.sasl_mechanism,
        sasl_username=kafka.sasl_username,
        sasl_password=password,
        ssl_cafile=str(kafka.ssl_cafile) if kafka.ssl_cafile else None,
        ssl_certfile=str(kafka.ssl_certfile) if kafka.ssl_certfile else None,
        ssl_keyfile=str(kafka.ssl_keyfile) if kafka.ssl_keyfile else None,
    )


def run_keycloak_command(
    action: str, settings: Settings, port: int | None = None, fail_open: bool = True
) -> int:
    """``authpipe keycloak up|down|status``: ``up`` starts it (``--port``, default 8180, and
    its management port + 1) with a mail sink at port + 2 as the realm's SMTP server, and
    records the port for ``down`` and ``status``; ``status`` exits 0 when it runs, 3
    otherwise."""
    if action not in ("up", "down", "status"):
        raise KeycloakError(f"unknown keycloak action {action!r}; use up, down or status")
    state_dir = settings.state_dir / "keycloak"
    layout = state_dir / LAYOUT_FILE
    saved = json.loads(layout.read_text()) if layout.is_file() else {}
    chosen = (port or DEFAULT_PORT) if action == "up" else int(saved.get("port", DEFAULT_PORT))
    key = captcha_key(state_dir) if action == "up" else None
    keycloak = LocalKeycloak(state_dir, chosen, provider_config(settings, key, fail_open))
    if action == "up":
        status = keycloak.up()
        mail_dir = sink_process_up(state_dir, chosen + 2)
        keycloak.point_smtp_at(chosen + 2)
        layout.write_text(json.dumps({"port": chosen}))
        print(f"admin: {ADMIN_USER} / {keycloak.admin_password()} ({keycloak.url}/admin)")
        print(
            f"provider: broker {keycloak.provider.bootstrap_servers}, edge {keycloak.provider.edge_url}"
        )
        print(f"mail: smtp://127.0.0.1:{chosen + 2}, kept in {mail_dir}/*.eml (nothing leaves)")
    elif action == "down":
        keycloak.down()
        sink_process_down(state_dir)
        status = keycloak.status()
    else:
        status = keycloak.status()
    print("\n".join(status.lines()), flush=True)
    if action == "status":
        return EXIT_RUNNING if status.running else EXIT_STOPPED
    return 0
