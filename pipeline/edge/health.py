"""What the service knows about the feed behind its view (``Health``): ready, why not,
lag and staleness. ``DecisionFeed`` is one; ``AlwaysReady`` is a view fed in-process."""

from __future__ import annotations

from typing import Protocol


class Health(Protocol):
    """What the service needs to know about the feed behind its view."""

    def ready(self) -> bool: ...

    def not_ready_reason(self) -> str | None: ...

    def lag_messages(self) -> int: ...

    def staleness_ms(self) -> int | None: ...


class AlwaysReady:
    """Health of a view fed in-process (no topic): always ready, never lagging."""

    def ready(self) -> bool:
        return True

    def not_ready_reason(self) -> str | None:
        return None

    def lag_messages(self) -> int:
        return 0

    def staleness_ms(self) -> int | None:
        return 0
