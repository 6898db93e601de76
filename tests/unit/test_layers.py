"""The layering the README promises: arrows point down, and only the command line reaches
into the faust shell."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
COMMAND_LINE = {"cli.py", "demo.py", "demo_services.py"}
BELOW = {
    "contracts": {"pipeline.contracts", "pipeline.errors"},
    "core": {"pipeline.contracts", "pipeline.core", "pipeline.errors"},
}


def imported(path: Path) -> set[str]:
    """Every ``pipeline.*`` module a file imports, at module level or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeline"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("pipeline"))
    return names


def test_nothing_outside_the_stream_imports_it_but_the_command_line() -> None:
    """No module outside pipeline/stream/ imports pipeline.stream, except the command line
    (cli.py and the demo: demo.py, demo_services.py)."""
    offenders = sorted(
        f"{path.relative_to(PIPELINE)}: {name}"
        for path in PIPELINE.rglob("*.py")
        if "stream" not in path.relative_to(PIPELINE).parts[:1] and path.name not in COMMAND_LINE
        for name in imported(path)
        if name == "pipeline.stream" or name.startswith("pipeline.stream.")
    )
    assert offenders == []


def test_contracts_and_core_import_nothing_above_them() -> None:
    """pipeline/contracts imports only itself and pipeline.errors; pipeline/core adds contracts."""
    offenders = []
    for package, allowed in BELOW.items():
        for path in (PIPELINE / package).rglob("*.py"):
            for name in imported(path):
                if not any(name == a or name.startswith(a + ".") for a in allowed):
                    offenders.append(f"{path.relative_to(PIPELINE)}: {name}")
    assert sorted(offenders) == []


def test_the_edge_does_not_load_faust() -> None:
    """A gateway process imports pipeline.edge.service without faust (the stream's framework)."""
    code = "import sys, pipeline.edge.service; assert 'faust' not in sys.modules, 'faust loaded'"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=PIPELINE.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
