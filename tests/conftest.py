"""Root test configuration: fixtures live in tests/plugins, one module per real service."""

from __future__ import annotations

import glob
import os

import pytest
from hypothesis import settings

# Tests assert behaviour, benchmarks speed (bench/): no per-example deadline, which on a
# shared 2-core machine under the integration suite's brokers and workers fails at random.
settings.register_profile("authpipe", deadline=None)
settings.load_profile("authpipe")

# There is no built-in digest key (a service refuses to start without one): the tests,
# and the services they start as subprocesses, use this one unless a test says otherwise.
TEST_DIGEST_KEY = "authpipe-test-digest-key-not-for-production"
os.environ.setdefault("AUTHPIPE_IDENTITY_DIGEST_KEY", TEST_DIGEST_KEY)

pytest_plugins = [
    "tests.plugins.kafka",
    "tests.plugins.clickhouse",
    "tests.plugins.worker",
    "tests.plugins.keycloak",
]

CORE_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pipeline", "core"
)
# What setup.py compiles with mypyc (its CORE_MODULES).
COMPILED_CORE_MODULES = (
    "account",
    "attempt",
    "decision_keys",
    "decisions",
    "dedupe",
    "engine",
    "errors",
    "familiar_store",
    "grouping",
    "keys",
    "lockout",
    "normalise",
    "outbox",
    "records",
    "review",
    "rollup",
    "rules",
    "sequence",
    "shard",
    "source",
    "state",
    "strangers_tier",
    "streaks",
    "stuffing",
    "table",
    "window",
)


def compiled_path(name: str) -> str | None:
    """The compiled extension of ``pipeline.core.<name>`` beside its source, if built."""
    found = sorted(glob.glob(os.path.join(CORE_DIR, f"{name}.*.so")))
    return found[0] if found else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Python imports a compiled module in preference to its source: a core source edited
    after the build would go untested. Refuse to run on a stale compiled core."""
    stale = [
        name
        for name in COMPILED_CORE_MODULES
        if (so := compiled_path(name)) is not None
        and os.path.getmtime(os.path.join(CORE_DIR, f"{name}.py")) > os.path.getmtime(so)
    ]
    if stale:
        pytest.exit(
            f"pipeline/core/{{{','.join(stale)}}}.py changed after the compiled core was "
            "built: rebuild it (`bash scripts/setup`), or work on the pure-Python core "
            "(`AUTHPIPE_PURE_CORE=1 bash scripts/setup` removes the compiled modules)",
            returncode=4,
        )


# Under pytest-xdist (`scripts/test` runs two workers, `--dist loadfile`), each test file
# runs whole in one worker (its module fixtures start once), and the files sharing an
# expensive session fixture run in the same worker: the real Keycloak, the three-broker
# clusters. (xdist's ``loadgroup`` marks do nothing under pytest 9: it renames node ids
# through an attribute pytest no longer reads.)
SHARED_GROUPS = {"test_keycloak": "keycloak", "test_cluster_faults": "cluster"}


def _shared_group(nodeid: str) -> str | None:
    name = os.path.basename(nodeid.split("::", 1)[0])
    return next((g for prefix, g in SHARED_GROUPS.items() if name.startswith(prefix)), None)


SLOW_FILES = (
    "test_sim_gateway.py",
    "test_sim_pipeline.py",
    "test_bench_quick.py",
    "test_clients_other_languages.py",
    "test_audit_sink.py",
    "test_worker.py",
    "test_replay_parity.py",
    "test_stream_order.py",
    "test_rollup_changelog_broker.py",
    "test_kafka_stack.py",
    "test_sim_engine.py",
    "test_lockout_broker.py",
)
"""The files that take longest after the shared groups (30-85 s each, `--durations`),
longest first: a worker that starts one last keeps the other idle meanwhile."""


def _rank(nodeid: str) -> int:
    group = _shared_group(nodeid)
    if group is not None:
        return {"cluster": 0, "keycloak": 1}[group]
    name = os.path.basename(nodeid.split("::", 1)[0])
    return 2 + (SLOW_FILES.index(name) if name in SLOW_FILES else len(SLOW_FILES))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The shared groups first (the clusters' six minutes, then Keycloak), so a worker
    starts them while the other takes everything else, then the slowest files, longest
    first (`scripts/test` keeps this order: `--no-loadscope-reorder`); otherwise the
    collection's order (the sort is stable)."""
    items.sort(key=lambda item: _rank(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``loadfile``, with the files of a shared group as one scope."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _shared_group(nodeid) or super()._split_scope(nodeid)

    return GroupedFiles(config, log)
