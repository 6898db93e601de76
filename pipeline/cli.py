"""The authpipe console script: one subcommand per role.

Each handler imports its module lazily, so `authpipe stack status` does not pay for
faust or chdb imports. Bad flags exit 2 with argparse's message and the usage of the
subcommand they were given to; an AuthpipeError exits 1 with its message; nothing prints
a traceback for a user mistake.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline import cli_args as args_type
from pipeline.cli_sim import add_sim_commands
from pipeline.errors import AuthpipeError
from pipeline.logs import configure_logging
from pipeline.settings import Settings, load_settings, require_digest_key

Handler = Callable[[argparse.Namespace, Settings], int]
# Long-running services log JSON to stdout for collectors; every other command prints its
# result for people on stdout and its log events on stderr (pipeline.logs).
SERVICES = frozenset({"worker", "sink", "edge", "alerts"})


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.dev.command import run_stack_command

    return run_stack_command(args.action, settings, args.brokers, args.tls)


def _keycloak(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.dev.keycloak_command import run_keycloak_command

    return run_keycloak_command(args.action, settings, args.port, fail_open=not args.fail_closed)


def _clickhouse(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks.migrate import run_migrate_command

    if args.cluster is not None:
        clickhouse = settings.clickhouse.model_copy(update={"cluster": args.cluster})
        settings = settings.model_copy(update={"clickhouse": clickhouse})
    return run_migrate_command(settings, print_only=args.print_sql)


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.stream.worker import run_worker

    if args.policy is not None:
        settings = settings.model_copy(update={"policy_path": args.policy})
    _publish_fingerprint(settings)
    return run_worker(settings)


def _publish_fingerprint(settings: Settings) -> None:
    """The worker's normalisation fingerprint for edges and operators to compare with
    (``pipeline.fingerprint``); a broker that refuses it (ACLs, down) is logged, and the
    worker starts anyway. A bad policy or setting raises here as the worker would."""
    import asyncio

    from pipeline.fingerprint import FingerprintError, publish_fingerprint
    from pipeline.logs import get_logger
    from pipeline.wiring import load_policy

    policy = load_policy(settings.policy_path)
    try:
        asyncio.run(publish_fingerprint(settings, policy))
    except FingerprintError as exc:
        get_logger("worker").warning("normalisation_fingerprint_unpublished", error=str(exc))


def _edge(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.edge.service import run_edge

    return run_edge(settings, host=args.host, port=args.port)


def _sink(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks.command import run_sink

    return run_sink(settings)


def _alerts(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks.alerts import run_alerts_command

    return run_alerts_command(
        settings,
        once=args.once,
        interval_s=args.interval_s,
        webhook=args.webhook,
        to_stdout=args.stdout,
    )


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.demo import DemoOptions, run_demo

    options = DemoOptions(
        rate=args.rate,
        duration_s=args.duration_s,
        history_s=args.history_s,
        seed=args.seed,
        out=args.out,
        keep_services=args.keep_services,
    )
    return run_demo(settings, options)


# -- the operator's block-list (pipeline.manual) -------------------------------------------


def _decisions(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.core.grouping import check_block_source
    from pipeline.manual import Target, default_operator, run_decisions_command
    from pipeline.wiring import nat64_networks

    if args.decisions_action == "unlock":
        return run_decisions_command(
            settings,
            "unlock",
            target=Target(args.tenant, account=args.account),
            reason=args.reason,
            operator=args.by or default_operator(),
        )
    if args.decisions_action != "add":
        return run_decisions_command(
            settings,
            args.decisions_action,
            decision_id=getattr(args, "id", ""),
            show_all=getattr(args, "all", False),
        )
    if args.source is not None:
        try:
            check_block_source(
                args.source,
                settings.ingest.ipv4_prefix,
                settings.ingest.ipv6_prefix,
                nat64_networks(settings),
            )
        except ValueError as exc:
            args.parser.error(f"--source {exc}")
    target = Target(args.tenant, source=args.source, account=args.account)
    return run_decisions_command(
        settings,
        "add",
        target=target,
        ttl_ms=args.ttl,
        reason=args.reason,
        operator=args.by or default_operator(),
    )


def _add_decisions_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    decisions = sub.add_parser(
        "decisions", help="the operator's block-list: add, list, remove; unlock an account"
    )
    actions = decisions.add_subparsers(dest="decisions_action", required=True)
    add = actions.add_parser("add", help="block a source or an account (rule manual)")
    subject = add.add_mutually_exclusive_group(required=True)
    subject.add_argument(
        "--source",
        help="an address or CIDR no wider than one source "
        "(ingest.ipv4_prefix / ingest.ipv6_prefix)",
    )
    subject.add_argument(
        "--account",
        type=args_type.bounded_text(320),
        help="an account as typed; published only as its keyed digest",
    )
    add.add_argument(
        "--tenant", type=args_type.tenant, default="default", help="tenant (default: default)"
    )
    add.add_argument(
        "--ttl", type=args_type.ttl, required=True, help="how long: 90s, 30m, 1h, 7d (at most 366d)"
    )
    add.add_argument(
        "--reason", type=args_type.bounded_text(512), required=True, help="why (recorded)"
    )
    add.add_argument("--by", type=args_type.bounded_text(128), help="who decides (default: $USER)")
    add.set_defaults(handler=_decisions, parser=add)
    listing = actions.add_parser("list", help="active operator decisions (--all: every rule's)")
    listing.add_argument("--all", action="store_true", help="also the rules' decisions")
    listing.set_defaults(handler=_decisions, parser=listing)
    remove = actions.add_parser("remove", help="lift an operator decision by its id")
    remove.add_argument(
        "id", type=args_type.bounded_text(64), help="decision id (from decisions list)"
    )
    remove.set_defaults(handler=_decisions, parser=remove)
    unlock = actions.add_parser(
        "unlock",
        help="lift the rules' lock and bounds on an account (an audited operator's reset)",
    )
    unlock.add_argument(
        "--account", type=args_type.bounded_text(320), required=True, help="the account as typed"
    )
    unlock.add_argument(
        "--tenant", type=args_type.tenant, default="default", help="tenant (default: default)"
    )
    unlock.add_argument(
        "--reason", type=args_type.bounded_text(512), required=True, help="why (audited)"
    )
    unlock.add_argument(
        "--by",
        "--operator",
        dest="by",
        type=args_type.bounded_text(128),
        help="who decides (default: $USER)",
    )
    unlock.set_defaults(handler=_decisions, parser=unlock)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="authpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="the local dev stack (real Kafka broker)")
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.add_argument(
        "--brokers", type=int, default=None, help="up: nodes of a KRaft cluster (default 1)"
    )
    stack.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="up: add TLS and mutual-TLS listeners and a local CA (keytool)",
    )
    stack.set_defaults(handler=_stack)

    keycloak = sub.add_parser(
        "keycloak", help="a local Keycloak with authpipe's provider (after scripts/keycloak-setup)"
    )
    keycloak.add_argument("action", choices=["up", "down", "status"])
    keycloak.add_argument(
        "--port", type=args_type.port, help="up: HTTP port (default 8180; management on port+1)"
    )
    keycloak.add_argument(
        "--fail-closed", action="store_true", help="up: refuse sign-ins while the edge is down"
    )
    keycloak.set_defaults(handler=_keycloak)

    ch = sub.add_parser("clickhouse", help="ClickHouse schema")
    ch.add_argument("action", choices=["migrate"])
    ch.add_argument(
        "--cluster",
        default=None,
        metavar="NAME",
        help="ON CLUSTER DDL for cluster NAME: replicated tables, Distributed in "
        "front (default: clickhouse.cluster)",
    )
    ch.add_argument(
        "--print",
        dest="print_sql",
        action="store_true",
        help="print every statement instead of applying (no connection)",
    )
    ch.set_defaults(handler=_clickhouse)

    demo = sub.add_parser("demo", help="the main job: a mixed attack end to end on the local stack")
    demo.add_argument(
        "--rate", type=args_type.positive, default=25.0, help="simulated logins/s (default 25)"
    )
    demo.add_argument(
        "--duration-s",
        type=args_type.positive,
        default=3600.0,
        help="simulated traffic span in seconds (default 3600)",
    )
    demo.add_argument(
        "--history-s",
        type=args_type.non_negative,
        default=3600.0,
        help="simulated seconds of ordinary traffic before it, the warm start (default 3600; "
        "0: a cold start, every wave challenges people at places it never saw)",
    )
    demo.add_argument("--seed", type=int, default=1, help="scenario seed (default 1)")
    demo.add_argument("--out", type=Path, default=Path("report.html"), help="report path")
    demo.add_argument(
        "--keep-services",
        action="store_true",
        help="keep worker, sink and edge running after the run (Ctrl-C stops)",
    )
    demo.set_defaults(handler=_demo)

    worker = sub.add_parser("worker", help="the stream processors (faust-streaming)")
    worker.add_argument(
        "--policy", type=args_type.existing_file, help="policy TOML (default: built-in)"
    )
    worker.set_defaults(handler=_worker, service=True)

    edge = sub.add_parser("edge", help="the gateway edge: decision view, check, block-list")
    edge_sub = edge.add_subparsers(dest="edge_action", required=True)
    serve = edge_sub.add_parser("serve", help="serve /v1/check and /v1/blocklist over HTTP")
    serve.add_argument("--host", help="bind address (default: edge.host, 127.0.0.1)")
    serve.add_argument("--port", type=args_type.port, help="HTTP port (default: edge.port, 8080)")
    serve.set_defaults(handler=_edge, service=True)

    sink = sub.add_parser("sink", help="the ClickHouse sink: audit, decisions, alerts, DLQ")
    sink.set_defaults(handler=_sink, service=True)

    alerts = sub.add_parser("alerts", help="alert rules over ClickHouse (dashboards/alerts)")
    alerts.add_argument("action", choices=["run"])
    alerts.add_argument("--once", action="store_true", help="evaluate once and exit")
    alerts.add_argument(
        "--interval-s",
        type=args_type.seconds,
        default=60.0,
        help="seconds between evaluations (60)",
    )
    alerts.add_argument("--webhook", metavar="URL", help="also POST each new alert as JSON")
    alerts.add_argument("--stdout", action="store_true", help="also print each new alert")
    alerts.set_defaults(handler=_alerts, service=True)

    add_sim_commands(sub)
    _remember_parsers(parser)
    _add_decisions_command(sub)
    return parser


def _remember_parsers(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)command its own parser as ``args.parser``, so that an unknown flag is
    reported with the usage of the subcommand it was given to (argparse reports unknown
    arguments from the top-level parser, with the top-level usage)."""
    parser.set_defaults(parser=parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _remember_parsers(child)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        settings = load_settings()
        level = settings.log.level
        if args.command == "demo" and level == "info":
            level = "warning"  # the demo narrates its steps itself; its services log to files
        configure_logging(level, settings.log.format, one_shot=args.command not in SERVICES)
        if getattr(args, "service", False):
            require_digest_key(settings)  # before connecting anywhere: no guessable default
        handler: Handler = args.handler
        return handler(args, settings)
    except AuthpipeError as exc:
        print(f"authpipe: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
