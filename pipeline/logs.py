"""structlog, configured once per process.

Services log JSON lines to stdout; on a terminal the output is readable console text.
Log events are constant names with key=value pairs, never formatted strings.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

_configured = False


def configure_logging(
    level: str = "info", fmt: Literal["auto", "json", "console"] = "auto"
) -> None:
    """Configure structlog and the stdlib root logger; later calls are no-ops."""
    global _configured
    if _configured:
        return
    _configured = True
    use_console = fmt == "console" or (fmt == "auto" and sys.stdout.isatty())
    renderer: Any = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    numeric = logging.getLevelNamesMapping()[level.upper()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    # Libraries (aiokafka, faust) log through the stdlib; keep them quiet and on stderr.
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)


def get_logger(name: str) -> Any:
    """A structlog logger bound to a component name."""
    return structlog.get_logger(component=name)
