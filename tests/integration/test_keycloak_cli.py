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
