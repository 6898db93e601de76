"""Column-oriented inserts: the sink hands clickhouse-connect columns, not rows.

clickhouse-connect encodes an insert column by column (Native format). Given rows, it
first pivots them into columns in its Cython ``pivot`` (a fresh list per column per
block); given columns (``column_oriented=True``), it encodes them as they are. The sink's
rows come from JSON as lists, so a transposition happens once either way; ``to_columns``
does it with ``zip`` in C, one tuple per column, which ``bench.bench_sink`` measured against
the client's pivot (bench/README.md, B5).

Invariant: ``to_columns(rows)[c][r] == rows[r][c]`` for every row and column; every row
has the same length (the lanes build them from one column list per table).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def to_columns(rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """The values of ``rows`` as one tuple per column (empty for no rows)."""
    return list(zip(*rows, strict=True))
