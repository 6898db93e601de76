"""Versioned ClickHouse migrations: ``schemas/clickhouse/NNN_name.sql``, applied in order.

* A file holds statements separated by ``;`` at the end of a line.
* Two placeholders are filled in from settings before a statement runs: ``{database}``
  (``clickhouse.database``) and ``{ttl_days}`` (``clickhouse.ttl_days``). Any other
  ``{word}`` is an error; ClickHouse's own ``{name:Type}`` parameters are left alone.
* Applied versions are rows of ``<database>.schema_migrations`` (version, name, checksum of
  the file as written, applied_at). A file is recorded after all its statements ran; its
  statements use ``IF NOT EXISTS``, so a file cut short by a failure runs again cleanly.
* Running again applies nothing. A file whose checksum differs from the applied one is an
  error: add a new migration instead of editing an applied one. Changing ``ttl_days``
  later therefore needs a new migration (``ALTER TABLE … MODIFY TTL``), not a re-run.
* Two migrators at the same time are not guarded against: run one.
* Cluster mode (``clickhouse.cluster`` or ``--cluster NAME``): every statement is rewritten
  into ``ON CLUSTER`` DDL with replicated local tables and Distributed tables in front
  (:mod:`pipeline.sinks.cluster`); ``--print`` shows the statements without connecting.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline.logs import get_logger
from pipeline.settings import ClickHouseSettings, Settings
from pipeline.sinks.clickhouse import ClickHouse, ClickHouseError, check_identifier
from pipeline.sinks.cluster import CLUSTER_INSERT_SETTINGS, create_database, for_cluster
from pipeline.sinks.connect import open_clickhouse

_log = get_logger("clickhouse.migrate")

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas" / "clickhouse"
MIGRATIONS_TABLE = "schema_migrations"

_FILE_NAME = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")
_STATEMENT_END = re.compile(r";[ \t]*(?:\r?\n|\Z)")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_COMMENT_LINE = re.compile(r"^\s*--.*$", re.MULTILINE)


@dataclass(frozen=True)
class Migration:
    """One migration file: its version, name, raw text and the text's checksum."""

    version: int
    name: str
    path: Path
    text: str

    @property
    def label(self) -> str:
        return f"{self.version:03d}_{self.name}"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def load_migrations(schema_dir: Path = SCHEMA_DIR) -> list[Migration]:
    """The migration files of schema_dir, ordered by version; versions must be unique."""
    if not schema_dir.is_dir():
        raise ClickHouseError(
            f"migration directory {schema_dir} does not exist; run from a checkout of authpipe"
        )
    migrations: dict[int, Migration] = {}
    for path in sorted(schema_dir.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ClickHouseError(
                f"migration file {path.name} is not named NNN_name.sql; rename it"
            )
        version = int(match.group(1))
        if version in migrations:
            raise ClickHouseError(
                f"migrations {migrations[version].path.name} and {path.name} share version "
                f"{version:03d}; renumber one"
            )
        migrations[version] = Migration(version, match.group(2), path, path.read_text("utf-8"))
    return [migrations[v] for v in sorted(migrations)]


def split_statements(text: str) -> list[str]:
    """The statements of a migration file: split at ``;`` that ends a line."""
    statements = []
    for chunk in _STATEMENT_END.split(text):
        if _COMMENT_LINE.sub("", chunk).strip():
            statements.append(chunk.strip())
    return statements


def render(statement: str, settings: ClickHouseSettings) -> str:
    """Fill in {database} and {ttl_days}; refuse any other {word} placeholder."""
    values = {
        "database": check_identifier(settings.database, "clickhouse.database"),
        "ttl_days": str(settings.ttl_days),
    }

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise ClickHouseError(
                f"unknown placeholder {{{name}}} in a migration; "
                "only {database} and {ttl_days} are filled in"
            )
        return values[name]

    return _PLACEHOLDER.sub(fill, statement)


def statements_of(migration: Migration, settings: ClickHouseSettings) -> list[str]:
    """The statements that apply ``migration``: rendered, and for a cluster rewritten."""
    rendered = [render(statement, settings) for statement in split_statements(migration.text)]
    if not settings.cluster:
        return rendered
    return [out for statement in rendered for out in for_cluster(statement, settings.cluster)]


def migrations_table_ddl(settings: ClickHouseSettings) -> list[str]:
    """The statements that create ``schema_migrations`` (replicated for a cluster)."""
    database = check_identifier(settings.database, "clickhouse.database")
    create = (
        f"CREATE TABLE IF NOT EXISTS {database}.{MIGRATIONS_TABLE} ("
        " version UInt32, name String, checksum String, applied_at DateTime64(3, 'UTC')"
        ") ENGINE = MergeTree ORDER BY version"
    )
    if not settings.cluster:
        return [create]
    return [create_database(database, settings.cluster), *for_cluster(create, settings.cluster)]


def plan_sql(settings: ClickHouseSettings, schema_dir: Path = SCHEMA_DIR) -> list[str]:
    """Every statement a migrate on an empty database runs, in order (``--print``)."""
    out = migrations_table_ddl(settings)
    for migration in load_migrations(schema_dir):
        out += statements_of(migration, settings)
    return out


def apply_migrations(
    ch: ClickHouse, settings: ClickHouseSettings, schema_dir: Path = SCHEMA_DIR
) -> list[Migration]:
    """Apply the migrations not yet recorded, in order; return the ones applied."""
    migrations = load_migrations(schema_dir)
    for statement in migrations_table_ddl(settings):
        ch.command(statement)
    applied = _applied_checksums(ch)
    _check_unchanged(migrations, applied)
    done = []
    for migration in migrations:
        if migration.version in applied:
            continue
        _apply_one(ch, settings, migration)
        done.append(migration)
    return done


def run_migrate_command(settings: Settings, *, print_only: bool = False) -> int:
    """``authpipe clickhouse migrate``: apply pending migrations and say what was applied
    (``print_only``: print every statement instead, without connecting)."""
    if print_only:
        for statement in plan_sql(settings.clickhouse):
            print(f"{statement};\n")
        return 0
    total = len(load_migrations())
    with open_clickhouse(settings.clickhouse, create_database=True) as ch:
        done = apply_migrations(ch, settings.clickhouse)
        where = ch.where
    for migration in done:
        print(f"applied {migration.label}")
    print(
        f"{where} database {settings.clickhouse.database}: "
        f"{len(done)} applied, {total - len(done)} already up to date"
    )
    return 0


def _applied_checksums(ch: ClickHouse) -> dict[int, str]:
    rows = ch.query(f"SELECT version, any(checksum) FROM {MIGRATIONS_TABLE} GROUP BY version")
    return {int(version): str(checksum) for version, checksum in rows}


def _check_unchanged(migrations: list[Migration], applied: dict[int, str]) -> None:
    for migration in migrations:
        recorded = applied.get(migration.version)
        if recorded is not None and recorded != migration.checksum:
            raise ClickHouseError(
                f"migration {migration.label} changed after it was applied; "
                "restore the file and add a new migration for the change"
            )


def _apply_one(ch: ClickHouse, settings: ClickHouseSettings, migration: Migration) -> None:
    statements = statements_of(migration, settings)
    for index, statement in enumerate(statements, start=1):
        try:
            ch.command(statement)
        except ClickHouseError as exc:
            raise type(exc)(
                f"migration {migration.label}, statement {index} of {len(statements)} "
                f"failed: {exc}",
                exc.code,
            ) from exc
    ch.insert(
        MIGRATIONS_TABLE,
        ["version", "name", "checksum", "applied_at"],
        [[migration.version, migration.name, migration.checksum, datetime.now(UTC)]],
        settings=CLUSTER_INSERT_SETTINGS if settings.cluster else None,  # stored on return
    )
    _log.info(
        "clickhouse_migration_applied",
        version=migration.version,
        name=migration.name,
        statements=len(statements),
    )
