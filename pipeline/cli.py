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

from pipeline.errors import AuthpipeError
from pipeline.logs import configure_logging
from pipeline.settings import Settings, load_settings, require_digest_key

Handler = Callable[[argparse.Namespace, Settings], int]
# Long-running services log JSON to stdout for collectors; every other command prints its
# result for people on stdout and its log events on stderr (pipeline.logs).
SERVICES = frozenset({"worker", "sink", "edge", "alerts"})


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.dev.stack import run_stack_command

    return run_stack_command(args.action, settings)


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
    return run_worker(settings)


def _edge(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.edge.service import run_edge

    return run_edge(settings, host=args.host, port=args.port)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return int(text)


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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of seconds above 0")
    return value


def _demo(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.demo import DemoOptions, run_demo

    options = DemoOptions(
        rate=args.rate,
        duration_s=args.duration_s,
        seed=args.seed,
        out=args.out,
        keep_services=args.keep_services,
    )
    return run_demo(settings, options)


def _existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return path


def _existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is not a directory (write one with scorecard --save-outputs)"
        )
    return path


# -- simulator, scorecard, backtest, report (pipeline.sim) ------------------------------------


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def _positive(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def _non_negative(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return value


def _offset(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text} is not an offset (an integer >= 0)")
    return int(text)


def _utc_ms(text: str) -> int:
    """An RFC 3339 timestamp with an offset (``Z`` allowed), as epoch milliseconds."""
    from datetime import datetime

    from pipeline.contracts.models import datetime_to_ms

    try:
        value = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise argparse.ArgumentTypeError(
            f"{text} is not an RFC 3339 timestamp with an offset, like 2026-11-29T22:00:00Z"
        )
    return datetime_to_ms(value)


def _scenario_list(text: str) -> tuple[str, ...]:
    from pipeline.sim.scenarios import ScenarioError, parse_scenarios

    try:
        return parse_scenarios(text)
    except ScenarioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _simulate(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.simulate import run_simulate_command

    if args.dry_run and args.out is None:
        args.parser.error("--dry-run needs --out PATH (the events file to write)")
    if args.out is not None and not args.dry_run:
        args.parser.error("--out goes with --dry-run; without --dry-run events go to Kafka")
    return run_simulate_command(
        settings,
        scenarios=args.scenario,
        rate_per_s=args.rate,
        duration_s=args.duration_s,
        seed=args.seed,
        speedup=args.speedup,
        start_ms=args.start,
        truth=args.truth,
        out=args.out,
    )


def _scorecard(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.scorecard import run_scorecard_command

    if args.alerts is not None and args.decisions is None:
        args.parser.error("--alerts goes with --decisions PATH")
    if args.policy is not None and not args.engine:
        args.parser.error("--policy goes with --engine")
    return run_scorecard_command(
        settings,
        truth=args.truth,
        from_topics=args.decisions_from_topic,
        decisions=args.decisions,
        alerts=args.alerts,
        engine=args.engine,
        policy=args.policy,
        out=args.out,
        save_outputs=args.save_outputs,
        timeout_s=args.timeout_s,
        strict=args.strict,
    )


def _backtest(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.backtest import run_backtest_command
    from pipeline.sim.backtest_input import TopicRange

    if args.to_ts is not None and args.from_ts is None:
        args.parser.error("--to-ts goes with --from-ts")
    if args.to_offset is not None and args.from_offset is None:
        args.parser.error("--to-offset goes with --from-offset")
    if args.from_ts is not None and args.to_ts is not None and args.to_ts <= args.from_ts:
        args.parser.error("--to-ts must be after --from-ts")
    if (
        args.from_offset is not None
        and args.to_offset is not None
        and args.to_offset <= args.from_offset
    ):
        args.parser.error("--to-offset must be above --from-offset")
    if args.policy is None and args.verdicts is None:
        args.parser.error("--policy is required (or --verdicts OUT.jsonl for per-event verdicts)")
    topic_range = None
    if args.events is None:
        topic_range = TopicRange(args.from_ts, args.to_ts, args.from_offset, args.to_offset)
    return run_backtest_command(
        settings,
        candidate=args.policy,
        baseline=args.baseline_policy,
        events=args.events,
        topic_range=topic_range,
        truth=args.truth,
        out=args.out,
        verdicts=args.verdicts,
        live=args.live,
    )


def _report(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.report import run_report_command

    if args.truth is None and args.events is None:
        args.parser.error("give --truth PATH (labelled) or --events PATH")
    if args.alerts is not None and args.decisions is None:
        args.parser.error("--alerts goes with --decisions PATH")
    if args.policy is not None and not args.engine:
        args.parser.error("--policy goes with --engine")
    return run_report_command(
        settings,
        out=args.out,
        events=args.truth or args.events,
        decisions=args.decisions,
        alerts=args.alerts,
        engine=args.engine,
        policy=args.policy,
        scorecard=args.scorecard,
        title=args.title,
        plain_accounts=args.plain_accounts,
    )


# -- the operator's block-list (pipeline.manual) -------------------------------------------


def _ttl(text: str) -> int:
    from pipeline.manual import parse_ttl

    try:
        return parse_ttl(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _tenant(text: str) -> str:
    from pipeline.manual import check_tenant

    try:
        return check_tenant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _bounded_text(limit: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.strip() or len(text) > limit or not text.isprintable():
            raise argparse.ArgumentTypeError(f"give 1 to {limit} printable characters")
        return text

    return parse


def _decisions(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.core.grouping import check_block_source
    from pipeline.manual import Target, default_operator, run_decisions_command

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
                args.source, settings.ingest.ipv4_prefix, settings.ingest.ipv6_prefix
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
    decisions = sub.add_parser("decisions", help="the operator's block-list: add, list, remove")
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
        type=_bounded_text(320),
        help="an account as typed; published only as its keyed digest",
    )
    add.add_argument("--tenant", type=_tenant, default="default", help="tenant (default: default)")
    add.add_argument(
        "--ttl", type=_ttl, required=True, help="how long: 90s, 30m, 1h, 7d (at most 366d)"
    )
    add.add_argument("--reason", type=_bounded_text(512), required=True, help="why (recorded)")
    add.add_argument("--by", type=_bounded_text(128), help="who decides (default: $USER)")
    add.set_defaults(handler=_decisions, parser=add)
    listing = actions.add_parser("list", help="active operator decisions (--all: every rule's)")
    listing.add_argument("--all", action="store_true", help="also the rules' decisions")
    listing.set_defaults(handler=_decisions, parser=listing)
    remove = actions.add_parser("remove", help="lift an operator decision by its id")
    remove.add_argument("id", type=_bounded_text(64), help="decision id (from decisions list)")
    remove.set_defaults(handler=_decisions, parser=remove)


def _add_sim_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    simulate = sub.add_parser("simulate", help="produce simulated login traffic with ground truth")
    simulate.add_argument(
        "--scenario",
        type=_scenario_list,
        default="mixed",
        help="mixed (default: baseline and every attack but the two slow ones) or a comma list of "
        "baseline, brute_force, distributed_brute_force, spray, "
        "low_and_slow_spray, credential_stuffing, lockout_dos, uia_bruteforce, "
        "low_and_slow_bruteforce, low_and_slow_bruteforce_rotating",
    )
    simulate.add_argument(
        "--rate",
        type=_positive,
        default=20.0,
        help="ordinary events per simulated second in the main tenant (default 20); "
        "office, small tenant and attacks come on top",
    )
    simulate.add_argument(
        "--duration-s", type=_positive, default=600.0, help="simulated seconds (default 600)"
    )
    simulate.add_argument("--seed", type=int, default=1, help="the same seed gives the same events")
    simulate.add_argument(
        "--speedup",
        type=_non_negative,
        default=1.0,
        help="produce N times faster than event time; 0 = as fast as possible",
    )
    simulate.add_argument(
        "--start",
        type=_utc_ms,
        help="event time of the run's start, RFC 3339 (default: so that the run "
        "ends about when producing ends)",
    )
    simulate.add_argument(
        "--truth",
        type=Path,
        help="ground-truth JSONL (default: beside --out, else <state_dir>/sim/truth.jsonl)",
    )
    simulate.add_argument(
        "--dry-run", action="store_true", help="write events to --out, not to Kafka"
    )
    simulate.add_argument("--out", type=Path, help="events JSONL to write (with --dry-run)")
    simulate.set_defaults(handler=_simulate, parser=simulate)

    card = sub.add_parser("scorecard", help="score decisions and alerts against the ground truth")
    card.add_argument(
        "--truth", type=_existing_file, required=True, help="truth JSONL from simulate"
    )
    source = card.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--decisions-from-topic",
        action="store_true",
        help="read the decision topic (from the beginning) and the alerts topic",
    )
    source.add_argument("--decisions", type=_existing_file, help="decision records JSONL")
    source.add_argument(
        "--engine", action="store_true", help="run the core Engine over the truth events"
    )
    card.add_argument("--alerts", type=_existing_file, help="alerts JSONL (with --decisions)")
    card.add_argument(
        "--policy", type=_existing_file, help="policy TOML for --engine (default: settings)"
    )
    card.add_argument("--out", type=Path, help="write the scorecard as JSON here")
    card.add_argument(
        "--save-outputs",
        type=Path,
        metavar="DIR",
        help="also write the decisions and alerts read or computed (for authpipe report)",
    )
    card.add_argument(
        "--timeout-s", type=_positive, default=60.0, help="topic read timeout (default 60)"
    )
    card.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 if an attack was missed or a legitimate attempt refused",
    )
    card.set_defaults(handler=_scorecard, parser=card)

    backtest = sub.add_parser("backtest", help="replay recorded input through a candidate policy")
    backtest.add_argument(
        "--policy",
        type=_existing_file,
        help="candidate policy TOML (required for the diff; with --verdicts "
        "the policy to run, default: settings policy_path, else built-in)",
    )
    backtest.add_argument(
        "--baseline-policy",
        type=_existing_file,
        help="current policy TOML (default: settings policy_path, else built-in)",
    )
    where = backtest.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--from-ts", type=_utc_ms, help="input topic from this record time (RFC 3339)"
    )
    where.add_argument(
        "--from-offset", type=_offset, help="input topic from this offset (every partition)"
    )
    where.add_argument(
        "--events", type=_existing_file, help="events or truth JSONL instead of the topic"
    )
    backtest.add_argument(
        "--to-ts", type=_utc_ms, help="up to this time, exclusive (default: the end)"
    )
    backtest.add_argument(
        "--to-offset", type=_offset, help="up to this offset, exclusive (default: the end)"
    )
    backtest.add_argument("--truth", type=_existing_file, help="truth JSONL: adds both scorecards")
    backtest.add_argument("--out", type=Path, help="write the diff as JSON here")
    backtest.add_argument(
        "--verdicts",
        type=Path,
        metavar="OUT.jsonl",
        help="instead of a diff: one verdict line per event under --policy, "
        "emulating the gateway (refused attempts counted nowhere)",
    )
    backtest.add_argument(
        "--live",
        type=_existing_dir,
        metavar="DIR",
        help="the live run's decisions.jsonl and alerts.jsonl (scorecard --save-outputs): "
        "prints how many differ from the baseline replay",
    )
    backtest.set_defaults(handler=_backtest, parser=backtest)

    report = sub.add_parser("report", help="write a self-contained HTML report with charts")
    report.add_argument("--out", type=Path, required=True, help="HTML file to write")
    inputs = report.add_mutually_exclusive_group()
    inputs.add_argument("--truth", type=_existing_file, help="truth JSONL (labelled events)")
    inputs.add_argument("--events", type=_existing_file, help="events JSONL (unlabelled)")
    outputs = report.add_mutually_exclusive_group()
    outputs.add_argument("--decisions", type=_existing_file, help="decision records JSONL")
    outputs.add_argument(
        "--engine", action="store_true", help="compute decisions with the core Engine"
    )
    report.add_argument("--alerts", type=_existing_file, help="alerts JSONL (with --decisions)")
    report.add_argument("--policy", type=_existing_file, help="policy TOML for --engine")
    report.add_argument(
        "--scorecard", type=_existing_file, help="scorecard JSON (default: computed)"
    )
    report.add_argument("--title", default="authpipe report", help="page title")
    report.add_argument(
        "--plain-accounts",
        action="store_true",
        help="show typed account identifiers instead of digest prefixes",
    )
    report.set_defaults(handler=_report, parser=report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="authpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="the local dev stack (real Kafka broker)")
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.set_defaults(handler=_stack)

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
        "--rate", type=_positive, default=25.0, help="simulated logins/s (default 25)"
    )
    demo.add_argument(
        "--duration-s",
        type=_positive,
        default=3600.0,
        help="simulated traffic span in seconds (default 3600)",
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
    worker.add_argument("--policy", type=_existing_file, help="policy TOML (default: built-in)")
    worker.set_defaults(handler=_worker, service=True)

    edge = sub.add_parser("edge", help="the gateway edge: decision view, check, block-list")
    edge_sub = edge.add_subparsers(dest="edge_action", required=True)
    serve = edge_sub.add_parser("serve", help="serve /v1/check and /v1/blocklist over HTTP")
    serve.add_argument("--host", help="bind address (default: edge.host, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="HTTP port (default: edge.port, 8080)")
    serve.set_defaults(handler=_edge, service=True)

    sink = sub.add_parser("sink", help="the ClickHouse sink: audit, decisions, alerts, DLQ")
    sink.set_defaults(handler=_sink, service=True)

    alerts = sub.add_parser("alerts", help="alert rules over ClickHouse (dashboards/alerts)")
    alerts.add_argument("action", choices=["run"])
    alerts.add_argument("--once", action="store_true", help="evaluate once and exit")
    alerts.add_argument(
        "--interval-s", type=_seconds, default=60.0, help="seconds between evaluations (60)"
    )
    alerts.add_argument("--webhook", metavar="URL", help="also POST each new alert as JSON")
    alerts.add_argument("--stdout", action="store_true", help="also print each new alert")
    alerts.set_defaults(handler=_alerts, service=True)

    _add_sim_commands(sub)
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
