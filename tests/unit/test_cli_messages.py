"""The first-hour messages of the console script: usage of the subcommand given a bad flag,
a bad policy key in one line, help text without markup.

The CLI runs as a subprocess, as users run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AUTHPIPE_LOG_LEVEL": "warning",
        "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
    }
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_unknown_flag_prints_the_subcommands_usage() -> None:
    """`edge serve --prot 9000` exits 2 with the usage of `authpipe edge serve`, not the
    top-level usage."""
    done = cli("edge", "serve", "--prot", "9000")
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "usage: authpipe edge serve [-h] [--host HOST] [--port PORT]",
        "authpipe edge serve: error: unrecognized arguments: --prot 9000",
    ]


def test_unknown_flag_of_a_top_level_subcommand() -> None:
    """`stack up --force` names `authpipe stack` in its usage line."""
    done = cli("stack", "up", "--force")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == "authpipe stack: error: unrecognized arguments: --force"


def test_bad_policy_key_is_one_line(tmp_path: Path) -> None:
    """A misspelt policy key exits 1 with one line naming the table and the key; no pydantic
    banner, no URL."""
    policy = tmp_path / "p.toml"
    policy.write_text("[defaults.account]\nthreshhold = 5\n")
    done = cli("worker", "--policy", str(policy))
    assert done.returncode == 1
    assert done.stderr == (
        "authpipe: invalid policy: [defaults]: account.threshhold: unknown key "
        "(schemas/policy.example.toml lists every field)\n"
    )


def test_bad_policy_value_is_one_line(tmp_path: Path) -> None:
    """A bad value in a tenant table is one line too, naming the tenant and the field."""
    policy = tmp_path / "p.toml"
    policy.write_text("[tenants.acme.uia]\nthreshold = -1\n")
    done = cli("worker", "--policy", str(policy))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "https://" not in done.stderr
    assert done.stderr.startswith("authpipe: invalid policy: [tenants.acme]: uia.threshold: ")


def test_help_has_no_markup() -> None:
    """`authpipe --help` shows plain text: no RST double backquotes."""
    done = cli("--help")
    assert done.returncode == 0
    assert "``" not in done.stdout
    assert "The authpipe console script: one subcommand per role." in done.stdout.splitlines()


def test_stack_status_is_human_text_off_a_terminal(tmp_path: Path) -> None:
    """`stack status` piped (not a terminal): human lines, no JSON, no escape codes; exit 3
    when the broker is not running."""
    env = {**os.environ, "AUTHPIPE_STATE_DIR": str(tmp_path), "AUTHPIPE_LOG_LEVEL": "info"}
    env.pop("AUTHPIPE_LOG_FORMAT", None)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "stack", "status"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3
    assert done.stdout.splitlines()[:2] == ["kafka: stopped", "pid: -"]
    assert "{" not in done.stdout + done.stderr and "\x1b" not in done.stdout + done.stderr
