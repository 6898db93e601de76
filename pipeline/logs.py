"""structlog, configured once per process.

Services (worker, sink, edge, alerts) log JSON lines to stdout; on a terminal the output is
readable console text. One-shot commands (stack, simulate, scorecard, demo, ...) print
their result for people on stdout and log events on stderr, as console text unless
``log.format = "json"`` asks for JSON. Colour only where the stream is a terminal. Log events are constant names with key=value
pairs, never formatted strings. Libraries (aiokafka, faust) log through the stdlib: their
records are rendered the same way (same timestamp, same JSON or console form) on stderr,
and the transient errors a Kafka client logs while a broker or group is still starting
(a coordinator not elected yet, a partition leader moving) are dropped during the first
``STARTUP_GRACE_S`` of the process: later, the same errors are shown (then they are real).
"""

from __future__ import annotations

import logging
import logging.config
import sys
import time
from typing import Any, Literal, TextIO, cast

import structlog

_configured = False

# Retriable errors a Kafka client reports while the broker, a group coordinator, a
# partition leader or faust's own leader topic is still being set up; aiokafka logs them at
# ERROR and retries. Matched in the message (or the exception's name).
TRANSIENT_KAFKA_ERRORS = (
    "GroupCoordinatorNotAvailableError",
    "NotCoordinatorForGroupError",
    "CoordinatorLoadInProgressError",
    "NotLeaderForPartitionError",
    "LeaderNotAvailableError",
    "Marking the coordinator dead",  # a warning that follows the errors above
    # faust's leader-election topic, looked up (ERROR "not found in cluster metadata") in
    # the seconds before faust has created it:
    "-__assignor-__leader",
)
STARTUP_GRACE_S = 60.0


class StartupNoise(logging.Filter):
    """Drops the Kafka clients' transient startup errors during the grace period."""

    def __init__(self, grace_s: float = STARTUP_GRACE_S) -> None:
        super().__init__()
        self.until = time.monotonic() + grace_s
        self.dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("aiokafka", "faust")) or time.monotonic() > self.until:
            return True
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            message += type(record.exc_info[1]).__name__
        if any(name in message for name in TRANSIENT_KAFKA_ERRORS):
            self.dropped += 1
            return False
        return True


def _use_console(fmt: str) -> bool:
    return fmt == "console" or (fmt == "auto" and sys.stdout.isatty())


def _renderer(console: bool, stream: Any = None) -> Any:
    if console:
        tty = (stream or sys.stdout).isatty()
        return structlog.dev.ConsoleRenderer(colors=tty)
    return structlog.processors.JSONRenderer()


_SHARED: list[Any] = [
    structlog.processors.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def stdlib_logging_config(
    level: str = "info", fmt: Literal["auto", "json", "console"] = "auto"
) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for library loggers: warnings and up, on stderr,
    rendered like our own events, startup noise filtered. faust's worker takes it too."""
    numeric = max(logging.getLevelNamesMapping()[level.upper()], logging.WARNING)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"startup_noise": {"()": StartupNoise}},
        "formatters": {
            "authpipe": {
                "()": structlog.stdlib.ProcessorFormatter,
                "processor": _renderer(_use_console(fmt), sys.stderr),
                "foreign_pre_chain": [structlog.stdlib.add_logger_name, *_SHARED],
            }
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "authpipe",
                "filters": ["startup_noise"],
            }
        },
        "root": {"level": numeric, "handlers": ["stderr"]},
    }


def configure_logging(
    level: str = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
    *,
    one_shot: bool = False,
) -> None:
    """Configure structlog and the stdlib root logger; later calls are no-ops. ``one_shot``:
    a command whose stdout is its human result (events go to stderr, console unless json)."""
    global _configured
    if _configured:
        return
    _configured = True
    numeric = logging.getLevelNamesMapping()[level.upper()]
    stream = sys.stderr if one_shot else sys.stdout
    if one_shot and fmt == "auto":
        fmt = "console"
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *_SHARED,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _renderer(_use_console(fmt), stream),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(
            cast(TextIO, _Current("stderr" if one_shot else "stdout"))
        ),
        cache_logger_on_first_use=True,
    )
    logging.config.dictConfig(stdlib_logging_config(level, fmt))


class _Current:
    """``sys.stdout`` or ``sys.stderr`` as it is when a line is written, not when logging
    was configured: a process (or a test harness) that replaces the stream later gets the
    lines, and a replaced stream that was closed is never written to."""

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, text: str) -> int:
        written: int = getattr(sys, self.name).write(text)
        return written

    def flush(self) -> None:
        getattr(sys, self.name).flush()


def get_logger(name: str) -> Any:
    """A structlog logger bound to a component name."""
    return structlog.get_logger(component=name)
