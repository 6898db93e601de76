"""The command line's flag values: one parser per kind of value, each raising
``argparse.ArgumentTypeError`` with what was wrong (argparse exits 2 with it and the
subcommand's usage). Imports of the modules a parser checks against are lazy."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (0-65535)")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a finite number of seconds above 0")
    return value


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    return path


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text} is not a directory (write one with scorecard --save-outputs)"
        )
    return path


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def positive(text: str) -> float:
    value = number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be above 0")
    return value


def non_negative(text: str) -> float:
    value = number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return value


def offset(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text} is not an offset (an integer >= 0)")
    return int(text)


def utc_ms(text: str) -> int:
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


def scenario_list(text: str) -> tuple[str, ...]:
    from pipeline.sim.scenarios import ScenarioError, parse_scenarios

    try:
        return parse_scenarios(text)
    except ScenarioError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def ttl(text: str) -> int:
    from pipeline.manual import parse_ttl

    try:
        return parse_ttl(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def tenant(text: str) -> str:
    from pipeline.manual import check_tenant

    try:
        return check_tenant(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def bounded_text(limit: int) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if not text.strip() or len(text) > limit or not text.isprintable():
            raise argparse.ArgumentTypeError(f"give 1 to {limit} printable characters")
        return text

    return parse
