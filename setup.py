"""Build hook: compiles the policy core (``pipeline/core``) with mypyc.

Everything else about the package is in ``pyproject.toml``; this file only adds the
compiled extension modules. The ``.py`` sources stay in the package and are the
fallback: Python imports a module's compiled extension when it sits beside the source,
the source otherwise. So:

* ``AUTHPIPE_PURE_CORE=1 pip install -e .`` builds nothing (pure Python everywhere);
* a build that fails (no C compiler, a mypyc error) warns and installs pure Python
  rather than failing the install; ``tests/unit/test_core_compiled.py`` then fails, so
  CI notices that the core it tested is not the compiled one.

``pydantic.mypy`` (the mypy plugin in ``[tool.mypy]``) and the pinned mypy that compiles
come from ``[build-system] requires``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

# The modules on the hot path. ``policy.py``, ``policy_rules.py`` and ``policy_waves.py`` stay
# Python: they define pydantic models,
# which mypyc cannot compile (and which are read once per tenant, not per event).
CORE_MODULES = (
    "account", "attempt", "decision_keys", "decisions", "dedupe", "engine", "errors",
    "familiar_store",
    "grouping", "keys",
    "lockout", "normalise", "outbox", "records", "review", "rollup", "rules", "sequence",
    "shard", "source", "state", "strangers_tier", "streaks", "stuffing", "table", "window",
)  # fmt: skip


class OptionalBuildExt(build_ext):
    """build_ext that falls back to the pure-Python core when compiling fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any failure means "no compiled core"
            _warn(f"building the compiled core failed ({exc}); pipeline.core stays pure Python")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            _warn(f"compiling {ext.name} failed ({exc}); pipeline.core stays pure Python")


def _warn(message: str) -> None:
    sys.stderr.write(f"\nsetup.py: WARNING: {message}\n\n")


def _ext_modules() -> list[Any]:
    if os.environ.get("AUTHPIPE_PURE_CORE") == "1":
        return []
    try:
        from mypyc.build import mypycify

        return list(mypycify(
            [f"pipeline/core/{name}.py" for name in CORE_MODULES],
            opt_level="3",
            group_name="pipeline.core.native",  # one shared library, inside the package
        ))  # fmt: skip
    except (Exception, SystemExit) as exc:  # no mypy; a type error (mypyc exits)
        _warn(f"mypyc could not compile pipeline.core ({exc}); it stays pure Python")
        return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": OptionalBuildExt})
