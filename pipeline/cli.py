"""The ``authpipe`` console script: one subcommand per role.

Each handler imports its module lazily, so ``authpipe stack status`` does not pay for
faust or chdb imports. Bad flags exit 2 with argparse's message; an AuthpipeError
exits 1 with its message; nothing prints a traceback for a user mistake.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.errors import AuthpipeError
from pipeline.logs import configure_logging
from pipeline.settings import Settings, load_settings

Handler = Callable[[argparse.Namespace, Settings], int]


def _stack(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.stack import run_stack_command

    return run_stack_command(args.action, settings)


def _clickhouse(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.sinks.migrate import run_migrate_command

    return run_migrate_command(settings)


def _worker(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.stream.worker import run_worker

    if args.policy is not None:
        settings = settings.model_copy(update={"policy_path": args.policy})
    return run_worker(settings)


def _edge(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.edge.service import run_edge

    return run_edge(settings, host=args.host, port=args.port)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return int(text)


def _existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return path


def _not_yet(name: str) -> Handler:
    def handler(args: argparse.Namespace, settings: Settings) -> int:
        print(f"authpipe {name}: not built yet in this version", file=sys.stderr)
        return 2

    return handler


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="authpipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    stack = sub.add_parser("stack", help="the local dev stack (real Kafka broker)")
    stack.add_argument("action", choices=["up", "down", "status"])
    stack.set_defaults(handler=_stack)

    ch = sub.add_parser("clickhouse", help="ClickHouse schema")
    ch.add_argument("action", choices=["migrate"])
    ch.set_defaults(handler=_clickhouse)

    worker = sub.add_parser("worker", help="the stream processors (faust-streaming)")
    worker.add_argument("--policy", type=_existing_file, help="policy TOML (default: built-in)")
    worker.set_defaults(handler=_worker)

    edge = sub.add_parser("edge", help="the gateway edge: decision view, check, block-list")
    edge_sub = edge.add_subparsers(dest="edge_action", required=True)
    serve = edge_sub.add_parser("serve", help="serve /v1/check and /v1/blocklist over HTTP")
    serve.add_argument("--host", help="bind address (default: edge.host, 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="HTTP port (default: edge.port, 8080)")
    serve.set_defaults(handler=_edge)

    for name, help_text in [
        ("simulate", "produce simulated login traffic"),
    ]:
        sub.add_parser(name, help=help_text).set_defaults(handler=_not_yet(name))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load_settings()
        configure_logging(settings.log.level, settings.log.format)
        handler: Handler = args.handler
        return handler(args, settings)
    except AuthpipeError as exc:
        print(f"authpipe: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
