"""The simulator side of the command line: ``authpipe simulate``, ``scorecard``,
``backtest`` and ``report`` (their flags and handlers; each imports ``pipeline.sim``
lazily)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline import cli_args as args_type
from pipeline.settings import Settings


def _simulate(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.simulate import run_simulate_command

    if args.dry_run and args.out is None:
        args.parser.error("--dry-run needs --out PATH (the events file to write)")
    if args.out is not None and not args.dry_run:
        args.parser.error("--out goes with --dry-run; without --dry-run events go to Kafka")
    if args.gateway is not None:
        return _simulate_gateway(args, settings)
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
        history_s=args.history_s,
    )


def _simulate_gateway(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sim.live_gateway import run_gateway_command

    if args.dry_run:
        args.parser.error("--gateway asks a running edge: it goes without --dry-run")
    if args.speedup != 1.0 or args.start is not None:
        args.parser.error(
            "--gateway runs in event time (the edge checks expiry against its wall clock): "
            "leave --speedup at 1 and --start unset"
        )
    return run_gateway_command(
        settings,
        url=args.gateway,
        scenarios=args.scenario,
        rate_per_s=args.rate,
        duration_s=args.duration_s,
        seed=args.seed,
        truth=args.truth,
        history_s=args.history_s,
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


def add_sim_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    simulate = sub.add_parser("simulate", help="produce simulated login traffic with ground truth")
    simulate.add_argument(
        "--scenario",
        type=args_type.scenario_list,
        default="mixed",
        help="mixed (default: baseline and every attack but the two slow ones) or a comma list of "
        "baseline, brute_force, distributed_brute_force, spray, "
        "low_and_slow_spray, credential_stuffing, lockout_dos, uia_bruteforce, "
        "low_and_slow_bruteforce, low_and_slow_bruteforce_rotating",
    )
    simulate.add_argument(
        "--rate",
        type=args_type.positive,
        default=20.0,
        help="ordinary events per simulated second in the main tenant (default 20); "
        "office, small tenant and attacks come on top",
    )
    simulate.add_argument(
        "--duration-s",
        type=args_type.positive,
        default=600.0,
        help="simulated seconds (default 600)",
    )
    simulate.add_argument(
        "--history-s",
        type=args_type.non_negative,
        default=0.0,
        help="simulated seconds of the deployment's past before the run (ordinary sign-ins, "
        "apps' syncs, returning people: familiar places exist when a wave comes; default 0)",
    )
    simulate.add_argument("--seed", type=int, default=1, help="the same seed gives the same events")
    simulate.add_argument(
        "--speedup",
        type=args_type.non_negative,
        default=1.0,
        help="produce N times faster than event time; 0 = as fast as possible",
    )
    simulate.add_argument(
        "--start",
        type=args_type.utc_ms,
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
    simulate.add_argument(
        "--gateway",
        metavar="URL",
        help="act as a login service following the contract: ask this edge's /v1/check "
        "for each attempt (in event time; the history first, unchecked) and produce what "
        "the service reports under its answer (pipeline.sim.live_gateway)",
    )
    simulate.set_defaults(handler=_simulate, parser=simulate)

    card = sub.add_parser("scorecard", help="score decisions and alerts against the ground truth")
    card.add_argument(
        "--truth", type=args_type.existing_file, required=True, help="truth JSONL from simulate"
    )
    source = card.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--decisions-from-topic",
        action="store_true",
        help="read the decision topic (from the beginning) and the alerts topic",
    )
    source.add_argument("--decisions", type=args_type.existing_file, help="decision records JSONL")
    source.add_argument(
        "--engine", action="store_true", help="run the core Engine over the truth events"
    )
    card.add_argument(
        "--alerts", type=args_type.existing_file, help="alerts JSONL (with --decisions)"
    )
    card.add_argument(
        "--policy",
        type=args_type.existing_file,
        help="policy TOML that decided (--engine runs it; default: settings)",
    )
    card.add_argument("--out", type=Path, help="write the scorecard as JSON here")
    card.add_argument(
        "--save-outputs",
        type=Path,
        metavar="DIR",
        help="also write the decisions and alerts read or computed (for authpipe report)",
    )
    card.add_argument(
        "--timeout-s", type=args_type.positive, default=60.0, help="topic read timeout (default 60)"
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
        type=args_type.existing_file,
        help="candidate policy TOML (required for the diff; with --verdicts "
        "the policy to run, default: settings policy_path, else built-in)",
    )
    backtest.add_argument(
        "--baseline-policy",
        type=args_type.existing_file,
        help="current policy TOML (default: settings policy_path, else built-in)",
    )
    where = backtest.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--from-ts", type=args_type.utc_ms, help="input topic from this record time (RFC 3339)"
    )
    where.add_argument(
        "--from-offset",
        type=args_type.offset,
        help="input topic from this offset (every partition)",
    )
    where.add_argument(
        "--events", type=args_type.existing_file, help="events or truth JSONL instead of the topic"
    )
    backtest.add_argument(
        "--to-ts", type=args_type.utc_ms, help="up to this time, exclusive (default: the end)"
    )
    backtest.add_argument(
        "--to-offset", type=args_type.offset, help="up to this offset, exclusive (default: the end)"
    )
    backtest.add_argument(
        "--truth", type=args_type.existing_file, help="truth JSONL: adds both scorecards"
    )
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
        type=args_type.existing_dir,
        metavar="DIR",
        help="the live run's decisions.jsonl and alerts.jsonl (scorecard --save-outputs): "
        "prints how many differ from the baseline replay",
    )
    backtest.set_defaults(handler=_backtest, parser=backtest)

    report = sub.add_parser("report", help="write a self-contained HTML report with charts")
    report.add_argument("--out", type=Path, required=True, help="HTML file to write")
    inputs = report.add_mutually_exclusive_group()
    inputs.add_argument(
        "--truth", type=args_type.existing_file, help="truth JSONL (labelled events)"
    )
    inputs.add_argument("--events", type=args_type.existing_file, help="events JSONL (unlabelled)")
    outputs = report.add_mutually_exclusive_group()
    outputs.add_argument("--decisions", type=args_type.existing_file, help="decision records JSONL")
    outputs.add_argument(
        "--engine", action="store_true", help="compute decisions with the core Engine"
    )
    report.add_argument(
        "--alerts", type=args_type.existing_file, help="alerts JSONL (with --decisions)"
    )
    report.add_argument(
        "--policy",
        type=args_type.existing_file,
        help="policy TOML that decided (--engine runs it; default: settings)",
    )
    report.add_argument(
        "--scorecard", type=args_type.existing_file, help="scorecard JSON (default: computed)"
    )
    report.add_argument("--title", default="authpipe report", help="page title")
    report.add_argument(
        "--plain-accounts",
        action="store_true",
        help="show typed account identifiers instead of digest prefixes",
    )
    report.set_defaults(handler=_report, parser=report)
