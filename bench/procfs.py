"""What the kernel says about a process's memory (``/proc/<pid>/status``), for the benches."""

from __future__ import annotations

import contextlib
from pathlib import Path


def status_kb(pid: int | str, names: tuple[str, ...]) -> dict[str, int]:
    """The ``names`` fields (e.g. ``VmRSS``, ``VmHWM``) of ``/proc/<pid>/status`` in kB;
    a field the kernel did not report, or a process that is gone, is left out."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in names:
                fields[name] = int(rest.split()[0])
    return fields
