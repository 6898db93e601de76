"""The core's modules in the order the README's architecture section lists them: each
imports only core modules listed before it, so arrows inside the core point down too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import CORE_DIR

ORDER = (
    "errors",
    "keys",
    "normalise",
    "grouping",
    "attempt",
    "window",
    "table",
    "state",
    "lockout",
    "dedupe",
    "sequence",
    "policy_rules",
    "policy_waves",
    "policy",
    "decision_keys",
    "familiar_store",
    "decisions",
    "review",
    "records",
    "outbox",
    "stuffing",
    "rules",
    "shard",
    "streaks",
    "account",
    "source",
    "strangers_tier",
    "rollup",
    "engine",
)


def _core_imports(name: str) -> set[str]:
    tree = ast.parse(Path(CORE_DIR, f"{name}.py").read_text())
    return {
        node.module.removeprefix("pipeline.core.")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module
        and node.module.startswith("pipeline.core.")
    }


def test_order_lists_every_core_module() -> None:
    assert sorted(ORDER) == sorted(
        p.stem for p in Path(CORE_DIR).glob("*.py") if p.stem != "__init__"
    )


def test_each_core_module_imports_only_modules_listed_before_it() -> None:
    late = {
        name: sorted(dep for dep in _core_imports(name) if dep not in ORDER[:i])
        for i, name in enumerate(ORDER)
    }
    assert {name: deps for name, deps in late.items() if deps} == {}
