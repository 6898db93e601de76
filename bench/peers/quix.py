"""Quix Streams in a virtualenv of its own, and the command that runs its peer.

Quix Streams 3.x requires ``pydantic<2.14`` and ``pydantic-settings<2.16`` while authpipe
requires ``pydantic>=2.14`` and ``pydantic-settings>=2.16``: pip cannot resolve both in
one environment (every quixstreams 3.x release pins below), so it is not a dev extra.
``ensure_env`` creates ``.state/bench/quix-venv`` once with ``pip install`` from PyPI
(about a minute) and reuses it while the pinned requirement is unchanged.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.peers import REPO_ROOT

REQUIREMENT = "quixstreams==3.28.1"
VENV_DIR = REPO_ROOT / ".state" / "bench" / "quix-venv"
PEER_SCRIPT = Path(__file__).with_name("quix_peer.py")


def env_python() -> Path:
    return VENV_DIR / "bin" / "python"


def env_ready() -> bool:
    stamp = VENV_DIR / ".authpipe-requirement"
    return env_python().exists() and stamp.exists() and stamp.read_text().strip() == REQUIREMENT


def ensure_env() -> Path:
    """The virtualenv's interpreter, creating the environment if needed."""
    if env_ready():
        return env_python()
    VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV_DIR)], check=True)
    subprocess.run(
        [str(env_python()), "-m", "pip", "install", "--quiet", REQUIREMENT],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (VENV_DIR / ".authpipe-requirement").write_text(REQUIREMENT + "\n")
    return env_python()


def command(
    python: Path, bootstrap: str, topic: str, events: int, state_dir: Path, budget_s: float
) -> list[str]:
    return [
        str(python),
        str(PEER_SCRIPT),
        bootstrap,
        topic,
        str(events),
        str(state_dir),
        str(budget_s),
    ]
