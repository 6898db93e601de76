"""Root test configuration: fixtures live in tests/plugins, one module per real service."""

from __future__ import annotations

import glob
import os

import pytest

pytest_plugins = ["tests.plugins.kafka", "tests.plugins.clickhouse", "tests.plugins.worker"]

CORE_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipeline", "core"
)
# What setup.py compiles with mypyc (its CORE_MODULES).
COMPILED_CORE_MODULES = (
    "attempt", "decisions", "dedupe", "engine", "errors", "keys", "normalise", "state",
    "sequence", "table", "window",
)  # fmt: skip


def compiled_path(name: str) -> str | None:
    """The compiled extension of ``pipeline.core.<name>`` beside its source, if built."""
    found = sorted(glob.glob(os.path.join(CORE_DIR, f"{name}.*.so")))
    return found[0] if found else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Python imports a compiled module in preference to its source: a core source edited
    after the build would go untested. Refuse to run on a stale compiled core."""
    stale = [
        name for name in COMPILED_CORE_MODULES
        if (so := compiled_path(name)) is not None
        and os.path.getmtime(os.path.join(CORE_DIR, f"{name}.py")) > os.path.getmtime(so)
    ]  # fmt: skip
    if stale:
        pytest.exit(
            f"pipeline/core/{{{','.join(stale)}}}.py changed after the compiled core was "
            "built: rebuild it (`bash scripts/setup`), or work on the pure-Python core "
            "(`AUTHPIPE_PURE_CORE=1 bash scripts/setup` removes the compiled modules)",
            returncode=4,
        )
