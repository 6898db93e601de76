"""``authpipe keycloak``'s mistakes, without starting Keycloak: each exits with one line
saying what was wrong and what to do, never a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def authpipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> object:
    """``authpipe keycloak <args>`` in this process, with a state dir and an empty cache."""
    monkeypatch.setenv("AUTHPIPE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AUTHPIPE_KEYCLOAK_CACHE", str(tmp_path / "no-cache"))

    def run(*args: str) -> Result:
        try:
            code = main(["keycloak", *args])
        except SystemExit as exc:
            code = int(exc.code or 0)
        out = capsys.readouterr()
        return Result(code, out.out, out.err)

    return run


def test_up_without_the_setup_names_the_script(authpipe: Any, tmp_path: Path) -> None:
    """Without scripts/keycloak-setup's dist, up exits 1 naming the script to run."""
    result = authpipe("up", "--port", "18390")
    assert result.returncode == 1
    assert result.stderr.startswith(
        "authpipe: no Keycloak 26.5.6 built with authpipe's provider in "
    )
    assert "run `bash scripts/keycloak-setup`" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_of_a_stopped_keycloak_exits_3(authpipe: Any, tmp_path: Path) -> None:
    """status says stopped and exits 3, creating nothing."""
    result = authpipe("status")
    assert result.returncode == 3
    assert result.stdout.splitlines()[0] == "keycloak: stopped"
    assert not (tmp_path / "state" / "keycloak" / "captcha.key").exists()


def test_bad_flags_exit_2_with_the_subcommands_usage(authpipe: Any, tmp_path: Path) -> None:
    """An unknown action or a port out of range exits 2 with the keycloak usage."""
    for args in (("restart",), ("up", "--port", "70000"), ("up", "--bogus")):
        result = authpipe(*args)
        assert result.returncode == 2, args
        assert result.stderr.startswith("usage: authpipe keycloak "), args


def test_down_when_nothing_runs_is_fine(authpipe: Any, tmp_path: Path) -> None:
    """down with nothing running exits 0 and says stopped."""
    result = authpipe("down")
    assert (result.returncode, result.stdout.splitlines()[0]) == (0, "keycloak: stopped")


def test_the_provider_takes_the_settings_broker_and_edge(tmp_path: Path) -> None:
    """keycloak up points the provider at the settings' broker, with their SASL/TLS
    choices, and at the edge (a wildcard bind is reached on loopback), as SPI options."""
    from pipeline.dev.keycloak_command import provider_config
    from pipeline.settings import Settings

    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    settings = Settings(
        kafka={
            "bootstrap_servers": "127.0.0.1:9093",
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": "login-keycloak",
            "sasl_password": "s3cret-pass",
            "ssl_cafile": str(tmp_path / "ca.pem"),
        },
        edge={"host": "0.0.0.0", "port": 8099, "token": "edge-token-1"},
    )
    options = provider_config(settings, "k" * 40, fail_open=False).spi_options()
    listener = "--spi-events-listener--authpipe--"
    check = "--spi-authenticator--authpipe-edge-check--"
    assert options == [
        f"{listener}bootstrap-servers=127.0.0.1:9093",
        f"{listener}topic=auth.login-attempts",
        f"{listener}security-protocol=SASL_SSL",
        f"{listener}sasl-mechanism=SCRAM-SHA-256",
        f"{listener}sasl-username=login-keycloak",
        f"{listener}sasl-password=s3cret-pass",
        f"{listener}ssl-cafile={tmp_path / 'ca.pem'}",
        f"{check}edge-url=http://127.0.0.1:8099",
        f"{check}edge-token=edge-token-1",
        f"{check}timeout-ms=250",
        f"{check}fail-open=false",
        f"{check}captcha-key={'k' * 40}",
    ]
