"""The compiled familiar store's side of the decision index: which engine a reader uses
(``AUTHPIPE_ENGINE``), and what the engine's bulk calls report back
(``DecisionIndex.apply_familiar_encoded`` and ``apply_familiar_batches``).

Kept apart from ``pipeline.core.decisions`` (the index and its verdicts): nothing here is
on the per-event path, and the engine is chosen once, at import.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, NamedTuple

from pipeline.core.errors import CoreError


class FamiliarBatch(NamedTuple):
    """What ``DecisionIndex.apply_familiar_encoded`` did with a fetch's messages."""

    handed_back: list[int]
    """The indexes of the messages it did not apply, in order: the caller's to apply."""
    put: int
    lifted: int
    """Tombstones applied (whether or not their key had a record)."""
    expired: int
    """Exempts already expired: their key's record removed, as a tombstone does."""
    changed: int
    """Records put or removed."""
    tenants: list[str]
    """The tenants of the exempts put."""


class FetchedBatches(NamedTuple):
    """What ``DecisionIndex.apply_familiar_batches`` did with a fetch answer's batches."""

    handed_back: list[tuple[bytes | None, bytes | None]]
    """The messages (key, value) it did not apply, in order: the caller's to apply."""
    put: int
    lifted: int
    expired: int
    changed: int
    tenants: list[str]
    next_offset: int
    """The offset to read next: past the last batch read."""
    records: int
    """Records read (at or after the fetch's offset, control batches not counted)."""
    unread: bool
    """A batch the engine does not read (another format, a codec, a bad CRC) stopped the
    walk at ``next_offset``: a consumer must read on from there."""


ENGINES = ("auto", "python", "rust")


def familiar_engine(mode: str | None = None) -> Any:
    """The compiled engine (``authpipe_engine``, engine/) whose ``FamiliarStore`` keeps a
    reader's familiar exempts, or None for the dict (the reference implementation).
    ``mode`` (default ``AUTHPIPE_ENGINE``, else ``auto``): ``python`` never uses it,
    ``rust`` requires it, ``auto`` uses it when it is installed."""
    mode = mode or os.environ.get("AUTHPIPE_ENGINE") or "auto"
    if mode not in ENGINES:
        raise CoreError(f"AUTHPIPE_ENGINE={mode!r} is not one of {', '.join(ENGINES)}")
    if mode == "python":
        return None
    try:
        return importlib.import_module("authpipe_engine")
    except ImportError:
        if mode == "rust":
            raise CoreError(
                "AUTHPIPE_ENGINE=rust but authpipe_engine is not installed: run scripts/build-engine"
            ) from None
        return None


FAMILIAR_ENGINE: Any = familiar_engine()
"""What a ``DecisionIndex`` of a reader uses by default, chosen once at import."""
