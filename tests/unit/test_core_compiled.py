"""The core the tests exercise is the compiled one (setup.py builds it with mypyc).

A build without a C compiler warns and installs the pure-Python core instead; this test
makes that visible. ``AUTHPIPE_PURE_CORE=1`` (set for the install and the test run) says
the pure core is wanted. ``tests/conftest.py`` refuses to run on a stale compiled core.
"""

from __future__ import annotations

import ast
import importlib
import os
from pathlib import Path

import pytest

from tests.conftest import COMPILED_CORE_MODULES, CORE_DIR, compiled_path

POLICY_MODULES = ("policy", "policy_rules", "policy_waves")
"""The core modules that define pydantic models and stay Python (setup.py)."""

PURE = os.environ.get("AUTHPIPE_PURE_CORE") == "1"


@pytest.mark.parametrize("name", COMPILED_CORE_MODULES)
def test_core_module_is_compiled_unless_pure_requested(name: str) -> None:
    module = importlib.import_module(f"pipeline.core.{name}")
    compiled = module.__file__ is not None and not module.__file__.endswith(".py")
    if PURE:
        assert not compiled, f"AUTHPIPE_PURE_CORE=1 but {module.__file__} is compiled"
    else:
        assert compiled, (
            f"pipeline.core.{name} is pure Python ({module.__file__}): the mypyc build "
            "failed or was skipped; see the warnings of `pip install -e .` (setup.py)"
        )
        assert compiled_path(name) is not None


def test_compiled_and_pure_cores_share_the_sources() -> None:
    """The policy models stay Python; every compiled module keeps its source beside it
    (the fallback, and what mypy and the tests' stale-build check read)."""
    for name in POLICY_MODULES:
        policy = importlib.import_module(f"pipeline.core.{name}")
        assert policy.__file__ is not None and policy.__file__.endswith(".py"), name
    for name in COMPILED_CORE_MODULES:
        assert os.path.exists(os.path.join(CORE_DIR, f"{name}.py"))


def test_the_tests_know_what_setup_compiles() -> None:
    """``tests/conftest.py`` repeats setup.py's module list (importing setup.py runs it)."""
    tree = ast.parse(Path(CORE_DIR, "..", "..", "setup.py").read_text())
    listed = next(
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "CORE_MODULES" for t in node.targets)
    )
    assert tuple(listed) == COMPILED_CORE_MODULES


def test_every_core_module_but_the_policy_models_is_compiled() -> None:
    """A new core module joins setup.py's list (only the policy's pydantic models stay Python)."""
    sources = {path.stem for path in Path(CORE_DIR).glob("*.py")} - {"__init__", *POLICY_MODULES}
    assert sorted(sources) == sorted(COMPILED_CORE_MODULES)
