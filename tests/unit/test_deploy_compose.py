"""deploy/docker-compose.yml ships no credential (issue 26 item 11): every password, token
and key is required from the environment (``${VAR:?message}``, as the digest key is),
never a literal or a default."""

from __future__ import annotations

import re
from pathlib import Path

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml"
TEXT = COMPOSE.read_text(encoding="utf-8")
SECRET = re.compile(r"PASSWORD|TOKEN|SECRET|_KEY\b")
REQUIRED = re.compile(r"\$\{(?P<name>[A-Z0-9_]+):\?[^}]+\}")
REFERENCE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?P<rest>[^}]*)\}")
SETTING = re.compile(r"^\s+(?P<name>[A-Z][A-Z0-9_]*): (?P<value>.+)$")
LINES = [line for line in TEXT.splitlines() if not line.lstrip().startswith("#")]


def test_every_secret_setting_is_required_from_the_environment() -> None:
    """Each PASSWORD/TOKEN/KEY setting's whole value is one ${VAR:?message}."""
    settings = [m for line in LINES if (m := SETTING.match(line)) and SECRET.search(m["name"])]
    assert sorted({m["name"] for m in settings}) == [
        "AUTHPIPE_CLICKHOUSE_GRAFANA_PASSWORD",
        "AUTHPIPE_EDGE_TOKEN",
        "AUTHPIPE_IDENTITY_DIGEST_KEY",
        "CLICKHOUSE_PASSWORD",
        "GF_SECURITY_ADMIN_PASSWORD",
    ]
    assert [m["name"] for m in settings if not REQUIRED.fullmatch(m["value"])] == []


def test_no_secret_variable_has_a_default() -> None:
    """Every reference to a secret variable is ${VAR:?...}: no :- or - default anywhere."""
    references = [m for line in LINES for m in REFERENCE.finditer(line) if SECRET.search(m["name"])]
    assert {m["name"] for m in references} == {
        "AUTHPIPE_CLICKHOUSE_GRAFANA_PASSWORD",
        "AUTHPIPE_CLICKHOUSE_PASSWORD",
        "AUTHPIPE_EDGE_TOKEN",
        "AUTHPIPE_GRAFANA_ADMIN_PASSWORD",
        "AUTHPIPE_IDENTITY_DIGEST_KEY",
    }
    assert [m[0] for m in references if not m["rest"].startswith(":?")] == []


def test_urls_and_health_checks_hold_no_literal_password() -> None:
    """The ClickHouse URL's password is the required variable; the health check reads the
    container's own variable ($$CLICKHOUSE_PASSWORD), not a password written here."""
    (url,) = [line for line in LINES if "AUTHPIPE_CLICKHOUSE_URL:" in line]
    assert url.split(": ", 1)[1].startswith(
        "http://authpipe:${AUTHPIPE_CLICKHOUSE_PASSWORD:?set AUTHPIPE_CLICKHOUSE_PASSWORD"
    )
    passwords = re.findall(r"--password[\s\\\",]+([^\s\\\",]+)", TEXT)
    assert passwords == ["$$CLICKHOUSE_PASSWORD"]
    assert re.findall(r"admin/admin|grafana-dev-change-me|authpipe:authpipe", TEXT) == []
