"""The worker's allocator tuning: glibc's mmap threshold stays fixed and arenas are capped."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest

from pipeline.runtime import ARENA_MAX, MMAP_THRESHOLD_BYTES, tune_allocator

# In a child process (mallopt is process-wide): free a 4 MB buffer, then allocate 2 MB and
# report how many more bytes glibc holds in mmapped chunks once the 2 MB buffer lives.
PROBE = """
import ctypes, sys
import orjson
from pipeline.runtime import tune_allocator
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
done = tune_allocator({}) if sys.argv[1] == "tuned" else {}
big = bytearray(4 << 20)
del big
before = libc.mallinfo2().hblkhd
buffer = bytearray(2 << 20)
print(orjson.dumps({"set": done, "mmapped": libc.mallinfo2().hblkhd - before}).decode())
"""


def _probe(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = orjson.loads(out.stdout)
    return result


@pytest.mark.skipif(
    not sys.platform.startswith("linux") and not os.environ.get("CI"),
    reason="glibc's mallopt is Linux-only (never skipped in CI, which runs on Linux)",
)
def test_tuned_allocator_maps_a_large_buffer_after_a_larger_one_was_freed() -> None:
    """With glibc's defaults the freed 4 MB raises the mmap threshold and the next 2 MB comes
    from the heap (0 bytes mapped); tuned, the threshold stays at 128 kB and it is mapped."""
    default, tuned = _probe("default"), _probe("tuned")
    assert default == {"set": {}, "mmapped": 0}
    assert tuned["set"] == {
        "MALLOC_ARENA_MAX": ARENA_MAX,
        "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD_BYTES,
    }
    assert isinstance(tuned["mmapped"], int) and tuned["mmapped"] >= 2 << 20


def test_a_malloc_variable_the_user_set_wins() -> None:
    """MALLOC_ARENA_MAX / MALLOC_MMAP_THRESHOLD_ in the environment are left to glibc."""
    assert tune_allocator({"MALLOC_ARENA_MAX": "4", "MALLOC_MMAP_THRESHOLD_": "65536"}) == {}
