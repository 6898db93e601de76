"""No built-in digest key: services refuse to start without one; `stack up` writes one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.settings import (
    MissingDigestKeyError,
    ensure_digest_key_file,
    load_settings,
    require_digest_key,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 32


@pytest.fixture
def no_key_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("AUTHPIPE_IDENTITY_DIGEST_KEY", raising=False)
    monkeypatch.delenv("AUTHPIPE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_settings_have_no_built_in_key(no_key_env: Path) -> None:
    """Without a key in settings or the state dir, the key is unset and requiring it fails."""
    settings = load_settings(state_dir=no_key_env / "state")
    assert settings.identity.digest_key is None
    with pytest.raises(MissingDigestKeyError) as caught:
        require_digest_key(settings)
    message = str(caught.value)
    assert message.startswith("identity.digest_key is not set: set AUTHPIPE_IDENTITY_DIGEST_KEY")
    assert "\n" not in message


def test_a_key_shorter_than_32_bytes_is_refused(no_key_env: Path) -> None:
    """31 bytes is a config error naming identity.digest_key; 32 bytes is accepted."""
    with pytest.raises(ConfigError, match=r"identity\.digest_key: Value error, is 31 bytes"):
        load_settings(identity={"digest_key": "k" * 31})
    assert require_digest_key(load_settings(identity={"digest_key": KEY})) == KEY


def test_key_file_is_written_once_and_read_back(no_key_env: Path) -> None:
    """ensure_digest_key_file writes 32+ random bytes (0600) once; settings read it back."""
    state = no_key_env / "state"
    path = ensure_digest_key_file(state)
    key = path.read_text().strip()
    assert path == state / "digest.key"
    assert len(key) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert ensure_digest_key_file(state).read_text().strip() == key
    assert ensure_digest_key_file(no_key_env / "other").read_text().strip() != key
    assert require_digest_key(load_settings(state_dir=state)) == key


def test_explicit_key_wins_over_the_key_file(no_key_env: Path) -> None:
    """A configured key is used as is, whatever the state dir holds."""
    state = no_key_env / "state"
    ensure_digest_key_file(state)
    assert load_settings(state_dir=state, identity={"digest_key": KEY}).identity.digest_key == KEY


def test_a_short_key_file_is_refused(no_key_env: Path) -> None:
    """A truncated key file is an error that says what to do, not a weak key."""
    state = no_key_env / "state"
    state.mkdir()
    (state / "digest.key").write_text("short\n")
    with pytest.raises(
        ConfigError, match=r"identity\.digest_key from .*digest\.key is shorter than 32"
    ):
        load_settings(state_dir=state)


@pytest.mark.parametrize(
    "command", [["worker"], ["edge", "serve"], ["sink"], ["alerts", "run", "--once"]]
)
def test_every_service_refuses_to_start_without_a_key(tmp_path: Path, command: list[str]) -> None:
    """Exit 1 with one line naming identity.digest_key, before connecting to anything."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTHPIPE_")}
    env.update(
        {
            "AUTHPIPE_STATE_DIR": str(tmp_path / "state"),
            # Nothing listens here: a service that connected first would fail otherwise or hang.
            "AUTHPIPE_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "AUTHPIPE_CLICKHOUSE_URL": "http://127.0.0.1:1",
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *command],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("authpipe: identity.digest_key is not set: ")
    assert done.stdout == ""
