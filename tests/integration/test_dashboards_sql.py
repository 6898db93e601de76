"""Every Grafana panel's SQL, macros substituted, on seeded data with known answers (chdb).

The macros are expanded as the grafana-clickhouse-datasource plugin (v4) does
(pkg/macros/macros.go): ``$__timeFilter(c)`` → ``c >= toDateTime(from) AND c <=
toDateTime(to)``, ``$__fromTime``/``$__toTime`` → ``toDateTime(seconds)``,
``$__timeInterval(c)`` → ``toStartOfInterval(toDateTime(c), INTERVAL n second)``,
``$__interval_s`` → n; ``${tenant:singlequote}`` as Grafana formats a multi-value
variable: ``'acme'``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from pipeline.contracts.models import AUDIT_COLUMNS, datetime_to_ms
from pipeline.settings import ClickHouseSettings
from pipeline.sinks.clickhouse import ClickHouse, ClickHouseError
from pipeline.sinks.connect import open_clickhouse
from pipeline.sinks.migrate import apply_migrations
from pipeline.sinks.quarantine import DEAD_LETTERS_COLUMNS
from pipeline.sinks.tables import ALERTS_COLUMNS, DECISIONS_COLUMNS
from tests.unit.test_sink_support import audit_row

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO_ROOT / "dashboards" / "grafana"
DATASOURCE_YAML = (
    REPO_ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "clickhouse.yaml"
)
ATTEMPTS_COLUMNS = ("ts", *AUDIT_COLUMNS[1:])

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
FROM, TO = T0, T0 + timedelta(hours=1)
INTERVAL_S = 600
S1, S2, S3, S6 = "203.0.113.7", "203.0.113.8", "198.51.100.20", "2001:db8::/64"
S7 = "2001:db8:1:2::5"
ACCOUNTS = [f"a{i:02d}" for i in range(1, 11)]


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def expand(sql: str, *, tenants: tuple[str, ...] = ("acme",)) -> str:
    """The SQL as the plugin sends it for FROM..TO, INTERVAL_S and the tenant variable."""
    from_s, to_s = int(FROM.timestamp()), int(TO.timestamp())
    sql = re.sub(
        r"\$__timeFilter\(([^)]+)\)",
        lambda m: f"{m[1]} >= toDateTime({from_s}) AND {m[1]} <= toDateTime({to_s})",
        sql,
    )
    sql = re.sub(
        r"\$__timeInterval\(([^)]+)\)",
        lambda m: f"toStartOfInterval(toDateTime({m[1]}), INTERVAL {INTERVAL_S} second)",
        sql,
    )
    sql = sql.replace("$__fromTime", f"toDateTime({from_s})")
    sql = sql.replace("$__toTime", f"toDateTime({to_s})")
    sql = sql.replace("$__interval_s", str(INTERVAL_S))
    sql = sql.replace("${tenant:singlequote}", ",".join(f"'{t}'" for t in tenants))
    assert "$" not in sql, f"an unexpanded macro or variable is left in:\n{sql}"
    return sql


def attempt(
    minutes: float,
    event: str,
    *,
    tenant: str = "acme",
    account: str,
    source: str,
    outcome: str = "failure",
    decision: str = "allowed",
    flow: str = "login",
    weight: int = 1,
) -> list[Any]:
    return audit_row(
        0,
        at(minutes),
        tenant=tenant,
        account=account,
        source=source,
        outcome=outcome,
        decision=decision,
        weight=weight,
        partition=0,
        flow=flow,
        failure_reason=("refused" if decision == "block" else "bad_password")
        if outcome == "failure"
        else "",
        summary=weight > 1,
        event_id=event,
        kafka_offset=0,
    )


def decision_row(
    key: str, issued: float, expires: float, offset: int, *, lift: bool = False
) -> list[Any]:
    scope, tenant, account, source, _ = key.split("|")
    values = {
        "decision_id": "" if lift else f"d{offset}",
        "key": key,
        "tenant": tenant,
        "scope": scope,
        "account_digest": None if account == "-" else account,
        "source": None if source == "-" else source,
        "device_id": None,
        "applies_to": "" if lift else "untrusted",
        "action": "" if lift else "block",
        "rule": "" if lift else scope,
        "count": 0 if lift else 50,
        "threshold": 0 if lift else 50,
        "window_ms": 0 if lift else 900_000,
        "issued_at": at(issued),
        "expires_at": at(expires),
        "policy_version": "" if lift else "p1",
        "tombstone": lift,
        "operator": None,
        "reason": None,
        "challenge": None,
        "kafka_topic": "auth.throttle-decisions",
        "kafka_partition": 0,
        "kafka_offset": offset,
    }
    return [values[name] for name in DECISIONS_COLUMNS]


K1 = f"account_source|acme|a01|{S1}|-"
K2 = "account|acme|victim|-|-"
K3 = f"account_source|acme|wanda|{S2}|-"
K4 = "account|globex|g01|-|-"


def seed(ch: ClickHouse) -> None:
    """The scenario every expectation below is computed from, by hand."""
    rows = [attempt(5, f"f{i}", account=a, source=S1) for i, a in enumerate(ACCOUNTS)]
    rows.append(attempt(6, "summary:f10", account="", source=S1, weight=40))  # source cap
    rows += [attempt(15, f"v{i}", account="victim", source=S2, decision="block") for i in range(3)]
    rows.append(attempt(25, "v-ok", account="victim", source=S3, outcome="success"))
    rows += [
        attempt(35, f"u{i}", account=a, source=S6, outcome="success", flow="uia")
        for i, a in enumerate(ACCOUNTS[:5])
    ]
    rows.append(attempt(30, "w-ok", account="wanda", source=S3, outcome="success"))
    rows.append(attempt(40, "w-no", account="wanda", source=S2, decision="block"))
    rows.append(attempt(45, "v6", account="a01", source=S7))
    rows += [attempt(5, f"g{i}", tenant="globex", account=f"g{i:02d}", source=S1) for i in range(7)]
    rows += [attempt(-10, f"old{i}", account=f"old{i}", source=S1) for i in range(100)]
    rows = [[datetime_to_ms(r[0]), *r[1:]] for r in rows]
    ch.insert("attempts", ATTEMPTS_COLUMNS, rows)
    ch.insert(
        "decisions",
        DECISIONS_COLUMNS,
        [
            decision_row(K1, 10, 25, 1),
            decision_row(K2, 14, 74, 2),
            decision_row(K3, 20, 80, 3),
            decision_row(K3, 30, 30, 4, lift=True),
            decision_row(K4, 20, 80, 5),
        ],
    )
    alert_rows = [
        ["al-1", "spray_source", "acme", S1, None, 100, 100, at(5), at(20)],
        ["al-2", "source_many_tenants", "*", S1, None, 17, 17, at(0), at(60)],
        ["al-3", "spray_tenant", "globex", None, None, 9, 9, at(8), at(23)],
    ]
    ch.insert(
        "alerts",
        ALERTS_COLUMNS,
        [[*row, "p1", "auth.alerts", 0, i] for i, row in enumerate(alert_rows)],
    )
    dead = [
        [at(1), "not_json", "ingest", "auth.login-attempts", 0, 1],
        [at(1), "not_json", "ingest", "auth.login-attempts", 0, 2],
        [at(12), "too_large", "ingest", "auth.login-attempts", 1, 3],
        [at(12), "invalid_field", "ingest", "auth.login-attempts", 1, 4],
    ]
    ch.insert("dead_letters", DEAD_LETTERS_COLUMNS, dead)


def _accounts(a: str, failures: int, attempts: int, sources: int) -> tuple[Any, ...]:
    return ("acme", a, failures, attempts, sources)


EXPECTED: dict[tuple[str, str], list[tuple[Any, ...]]] = {
    ("authpipe-security", "Attempts by outcome"): [
        (at(0), "failure", 50),
        (at(10), "failure", 3),
        (at(20), "success", 1),
        (at(30), "success", 6),
        (at(40), "failure", 2),
    ],
    ("authpipe-security", "Failures by flow"): [
        (at(0), "login", 50),
        (at(10), "login", 3),
        (at(40), "login", 2),
    ],
    ("authpipe-security", "Refused attempts by flow"): [(at(10), "login", 3), (at(40), "login", 1)],
    ("authpipe-security", "Top attacked accounts"): [
        _accounts("victim", 3, 4, 2),
        _accounts("a01", 2, 3, 3),
        *[_accounts(a, 1, 2, 2) for a in ACCOUNTS[1:5]],
        *[_accounts(a, 1, 1, 1) for a in ACCOUNTS[5:]],
        _accounts("wanda", 1, 2, 2),
    ],
    ("authpipe-security", "Top sources"): [
        ("acme", S1, 50, 50, 10),
        ("acme", S2, 4, 4, 2),
        ("acme", S7, 1, 1, 1),
    ],
    ("authpipe-security", "Top source prefixes"): [
        ("203.0.113.0/24", 54, 2, 12),
        ("2001:db8:1::/48", 1, 1, 1),
    ],
    ("authpipe-security", "Owner collateral"): [("acme", "victim", 3, at(15), at(25))],
    ("authpipe-security", "Active decisions"): [
        ("acme", "account", K2, "block", "account", 50, at(14), at(74)),
    ],
    ("authpipe-security", "Recent decisions and lifts"): [
        (at(30), "acme", "account_source", K3, "lifted", "", 0, 0, at(30)),
        (at(20), "acme", "account_source", K3, "block", "account_source", 50, 50, at(80)),
        (at(14), "acme", "account", K2, "block", "account", 50, 50, at(74)),
        (at(10), "acme", "account_source", K1, "block", "account_source", 50, 50, at(25)),
    ],
    ("authpipe-security", "Decisions issued by scope"): [
        (at(10), "account", 1),
        (at(10), "account_source", 1),
        (at(20), "account_source", 1),
    ],
    ("authpipe-security", "Alerts by type"): [
        (at(0), "source_many_tenants", 1),
        (at(0), "spray_source", 1),
    ],
    ("authpipe-security", "Recent alerts"): [
        (at(5), at(20), "spray_source", "acme", S1, 100, 100, "al-1"),
        (at(0), at(60), "source_many_tenants", "*", S1, 17, 17, "al-2"),
    ],
    ("authpipe-pipeline", "Dead letters by reason"): [
        (at(0), "not_json", 2),
        (at(10), "invalid_field", 1),
        (at(10), "too_large", 1),
    ],
    ("authpipe-pipeline", "Dead letters by stage and reason"): [
        ("ingest", "not_json", 2),
        ("ingest", "invalid_field", 1),
        ("ingest", "too_large", 1),
    ],
    ("authpipe-pipeline", "Pipeline lag"): [
        ("attempts", at(45), 15 * 60),
        ("dead_letters", at(12), 48 * 60),
        ("decisions", at(30), 30 * 60),
    ],
    ("authpipe-pipeline", "Audit rows and attempts"): [
        (at(0), 50, 11, 40),
        (at(10), 3, 3, 0),
        (at(20), 1, 1, 0),
        (at(30), 6, 6, 0),
        (at(40), 2, 2, 0),
    ],
}


def dashboards() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))]


def panels() -> list[tuple[str, dict[str, Any]]]:
    return [
        (board["uid"], panel)
        for board in dashboards()
        for panel in board["panels"]
        if panel["type"] != "row"
    ]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouse]:
    """One migrated chdb with the scenario, shared by the module's tests (read only)."""
    settings = ClickHouseSettings(path=tmp_path_factory.mktemp("dashboards") / "chdb")
    with open_clickhouse(settings, create_database=True) as ch:
        apply_migrations(ch, settings)
        seed(ch)
        yield ch


def test_every_panel_has_an_expectation() -> None:
    """The expectations name exactly the dashboards' panels (no panel goes untested)."""
    assert sorted((uid, panel["title"]) for uid, panel in panels()) == sorted(EXPECTED)


def test_panels_use_the_provisioned_clickhouse_datasource() -> None:
    """Every panel and target, and the tenant variable, use the provisioned data source uid."""
    match = re.search(r"^\s*uid:\s*(\S+)\s*$", DATASOURCE_YAML.read_text(), re.MULTILINE)
    assert match is not None
    expected = {"type": "grafana-clickhouse-datasource", "uid": match[1]}
    for uid, panel in panels():
        assert panel["datasource"] == expected, (uid, panel["title"])
        for target in panel["targets"]:
            assert target["datasource"] == expected
            assert target["editorType"] == "sql"
    for board in dashboards():
        for variable in board["templating"]["list"]:
            assert variable["datasource"] == expected


@pytest.mark.parametrize(("uid", "title"), sorted(EXPECTED), ids=lambda v: str(v))
def test_panel_sql_returns_the_known_answer(seeded: ClickHouse, uid: str, title: str) -> None:
    """The panel's query, macros expanded for tenant acme, returns exactly the expected rows."""
    (panel,) = [p for u, p in panels() if u == uid and p["title"] == title]
    (target,) = panel["targets"]
    assert seeded.query(expand(target["rawSql"])) == EXPECTED[(uid, title)]


def test_tenant_variable_lists_the_tenants_of_the_range(seeded: ClickHouse) -> None:
    """The tenant variable's query lists the tenants with attempts in the range."""
    for board in dashboards():
        (variable,) = board["templating"]["list"]
        assert seeded.query(expand(variable["query"]["rawSql"])) == [("acme",), ("globex",)]


def test_two_tenants_add_up(seeded: ClickHouse) -> None:
    """With tenants acme and globex selected, the globex failures join the acme ones."""
    (panel,) = [p for u, p in panels() if p["title"] == "Attempts by outcome"]
    sql = expand(panel["targets"][0]["rawSql"], tenants=("acme", "globex"))
    assert seeded.query(sql)[0] == (at(0), "failure", 57)


USERS_XML = REPO_ROOT / "deploy" / "clickhouse" / "users.d" / "grafana.xml"
COMPOSE = REPO_ROOT / "deploy" / "docker-compose.yml"


def grafana_profile() -> dict[str, str]:
    """The settings of the profile of the user the provisioned data source reads as."""
    import xml.etree.ElementTree as ET

    match = re.search(r"^\s*username:\s*(\S+)\s*$", DATASOURCE_YAML.read_text(), re.MULTILINE)
    assert match is not None
    root = ET.parse(USERS_XML).getroot()
    user = root.find(f"users/{match[1]}")
    assert user is not None, f"no user {match[1]} in {USERS_XML}"
    assert [q.text for q in user.findall("grants/query")] == ["GRANT SELECT ON authpipe.*"]
    password = user.find("password")
    assert (
        password is not None and password.get("from_env") == "AUTHPIPE_CLICKHOUSE_GRAFANA_PASSWORD"
    )
    profile = root.find(f"profiles/{user.findtext('profile')}")
    assert profile is not None
    return {child.tag: child.text or "" for child in profile if child.tag != "constraints"}


def test_grafana_reads_as_a_readonly_clickhouse_user() -> None:
    """The data source's user has readonly = 1 and SELECT on authpipe only; compose wires it."""
    assert grafana_profile()["readonly"] == "1"
    assert "$AUTHPIPE_CLICKHOUSE_GRAFANA_PASSWORD" in DATASOURCE_YAML.read_text()
    compose = COMPOSE.read_text()
    assert (
        "./clickhouse/users.d/grafana.xml:/etc/clickhouse-server/users.d/grafana.xml:ro" in compose
    )
    assert (
        compose.count(
            "AUTHPIPE_CLICKHOUSE_GRAFANA_PASSWORD: ${AUTHPIPE_CLICKHOUSE_GRAFANA_PASSWORD"
        )
        == 2
    )


def test_every_panel_runs_under_the_readonly_profile_and_writes_are_refused(
    seeded: ClickHouse,
) -> None:
    """With the profile's settings (readonly = 1) every panel gives its answer; writes fail."""
    settings = ", ".join(f"{name} = {value}" for name, value in grafana_profile().items())
    for uid, panel in panels():
        (target,) = panel["targets"]
        sql = f"{expand(target['rawSql'])}\nSETTINGS {settings}"
        assert seeded.query(sql) == EXPECTED[(uid, panel["title"])], (uid, panel["title"])
    for statement in (
        "INSERT INTO attempts SELECT * FROM attempts",
        "ALTER TABLE attempts DELETE WHERE 1",
        "DROP TABLE attempts",
        "CREATE TABLE evil (x UInt8) ENGINE = Memory",
    ):
        with pytest.raises(ClickHouseError) as refused:
            seeded.command(statement, settings={"readonly": 1})
        assert refused.value.code == 164, statement  # READONLY
    assert seeded.query("SELECT count() FROM attempts")[0][0] > 0
