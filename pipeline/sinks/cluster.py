"""Cluster mode of ``authpipe clickhouse migrate``: the same migrations, for a cluster.

With ``clickhouse.cluster`` set (or ``--cluster NAME``) each migration statement is
rewritten, after its placeholders are filled in, into ``ON CLUSTER`` DDL:

* ``CREATE TABLE <db>.t (…) ENGINE = <X>MergeTree …`` becomes two tables on every node:
  ``<db>.t_local`` with ``Replicated<X>MergeTree('/clickhouse/tables/{shard}/<db>/t_local',
  '{replica}', <X's own arguments>)`` (the server's ``{shard}`` and ``{replica}`` macros),
  and ``<db>.t`` with ``ENGINE = Distributed(<cluster>, <db>, t_local, <sharding key>)``
  in front. Writers and readers keep using ``t``: the sink's inserts go through the
  Distributed table to the shards, dashboards read all shards.
* ``CREATE MATERIALIZED VIEW <db>.v TO <db>.target AS SELECT … FROM <db>.source`` runs on
  every node between the local tables (``TO target_local``, ``FROM source_local``), so
  each shard aggregates the rows it stores; readers ``GROUP BY`` the key anyway, and
  ``uniqMerge`` merges the states of all shards.
* ``non_replicated_deduplication_window`` becomes ``replicated_deduplication_window``:
  the sink's dedup tokens work the same on replicated tables. Inserts through the
  Distributed table must be synchronous (``distributed_foreground_insert = 1``, which
  the sink sets in cluster mode) so that "the insert returned" still means "stored".
* The sharding key is a pure function of the row (``SHARDING_KEYS``), so a retried
  insert is cut into the same per-shard blocks and deduplicated on each shard. Tables
  written only by views (the minute aggregates) are never inserted into through their
  Distributed table; their key is ``rand()``.

* ``ALTER TABLE <db>.t ADD COLUMN …`` runs ``ON CLUSTER`` on the local table first, then on
  the Distributed table in front of it (a Distributed table names the columns it reads).

Any other statement is refused with a message: a migration that alters tables otherwise
must say how for a cluster. The migrations table itself is replicated too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from pipeline.sinks.clickhouse import ClickHouseError, check_identifier

LOCAL_SUFFIX: Final = "_local"
SHARDING_KEYS: Final[Mapping[str, str]] = {
    "attempts": "cityHash64(account_digest)",
    "decisions": "cityHash64(key)",
    "alerts": "cityHash64(alert_id)",
    "dead_letters": "cityHash64(kafka_topic, kafka_partition, kafka_offset)",
    "alert_firings": "cityHash64(alert_id)",
    "schema_migrations": "version",
}
VIEW_FED_KEY: Final = "rand()"
# Insert settings for a cluster: Distributed inserts are stored when they return.
CLUSTER_INSERT_SETTINGS: Final[Mapping[str, int]] = {"distributed_foreground_insert": 1}

_COMMENT_LINE = re.compile(r"^\s*--.*(?:\n|$)", re.MULTILINE)
_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\.(\w+)\s")
_ENGINE = re.compile(r"ENGINE\s*=\s*(\w*)MergeTree\b(?:\s*\(([^()]*)\))?")
_CREATE_VIEW = re.compile(
    r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)\.(\w+)\s+TO (\w+)\.(\w+)\s+AS\s"
)
_ADD_COLUMN = re.compile(r"^ALTER TABLE (\w+)\.(\w+)\s+(ADD COLUMN\b.*)$", re.DOTALL)
_FROM = re.compile(r"\bFROM (\w+)\.(\w+)\b")
_DEDUP_WINDOW = re.compile(r"\bnon_replicated_deduplication_window\b")


def for_cluster(statement: str, cluster: str) -> list[str]:
    """The ``ON CLUSTER`` statements that stand for one rendered migration statement."""
    check_identifier(cluster, "clickhouse.cluster")
    sql = _COMMENT_LINE.sub("", statement).strip()
    if match := _CREATE_TABLE.match(sql):
        return _table(sql, match, cluster)
    if match := _CREATE_VIEW.match(sql):
        return [_view(sql, match, cluster)]
    if match := _ADD_COLUMN.match(sql):
        database, table, change = match[1], match[2], match[3].rstrip(";").strip()
        return [
            f"ALTER TABLE {database}.{table}{LOCAL_SUFFIX} ON CLUSTER {cluster} {change}",
            f"ALTER TABLE {database}.{table} ON CLUSTER {cluster} {change}",
        ]
    raise ClickHouseError(
        f"cluster mode cannot rewrite this migration statement: {sql[:80]!r}; "
        "only CREATE TABLE, CREATE MATERIALIZED VIEW and ALTER TABLE … ADD COLUMN are "
        "rewritten: add a migration "
        "that states its ON CLUSTER form"
    )


def create_database(database: str, cluster: str) -> str:
    """The database on every node of the cluster."""
    return f"CREATE DATABASE IF NOT EXISTS {database} ON CLUSTER {cluster}"


def _table(sql: str, match: re.Match[str], cluster: str) -> list[str]:
    database, table = match[1], match[2]
    local = table + LOCAL_SUFFIX
    engine = _ENGINE.search(sql)
    if engine is None:
        raise ClickHouseError(
            f"cluster mode: table {database}.{table} is not of the MergeTree family; "
            "only MergeTree tables are replicated"
        )
    variant, arguments = engine[1], (engine[2] or "").strip()
    if variant.startswith("Replicated"):
        raise ClickHouseError(
            f"cluster mode: table {database}.{table} is already replicated; "
            "write migrations for a single server"
        )
    path = f"'/clickhouse/tables/{{shard}}/{database}/{local}', '{{replica}}'"
    replicated = (
        f"ENGINE = Replicated{variant}MergeTree({path}{', ' if arguments else ''}{arguments})"
    )
    body = sql[match.end() :]
    body = body[: engine.start() - match.end()] + replicated + body[engine.end() - match.end() :]
    body = _DEDUP_WINDOW.sub("replicated_deduplication_window", body)
    key = SHARDING_KEYS.get(table, VIEW_FED_KEY)
    return [
        f"CREATE TABLE IF NOT EXISTS {database}.{local} ON CLUSTER {cluster}\n{body}",
        f"CREATE TABLE IF NOT EXISTS {database}.{table} ON CLUSTER {cluster} "
        f"AS {database}.{local}\nENGINE = Distributed({cluster}, {database}, {local}, {key})",
    ]


def _view(sql: str, match: re.Match[str], cluster: str) -> str:
    database, view, target_db, target = match[1], match[2], match[3], match[4]
    select = sql[match.end() :]
    select = _FROM.sub(lambda m: f"FROM {m[1]}.{m[2]}{LOCAL_SUFFIX}", select)
    return (
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{view} ON CLUSTER {cluster}\n"
        f"TO {target_db}.{target}{LOCAL_SUFFIX}\nAS {select}"
    )
