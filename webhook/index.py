"""Round-robin allocation of pod indices 1..128 (DESIGN §3).

Indices only need to differ between pods that are pending on the same node at the same time, so cycling
through the range is enough; the extender resolves the rare collision at bind time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from extender.common.contract import MAX_POD_INDEX


class IndexAllocator:
    """Hands out 1, 2, ..., 128, 1, 2, ... Safe to share between threads and tasks: ``next`` is one step of
    an ``itertools.cycle``, a single C call that holds the GIL (no lock, no Python frame per pod)."""

    next: Callable[[], int]

    def __init__(self, start: int = 1, size: int = MAX_POD_INDEX) -> None:
        if not 1 <= size <= MAX_POD_INDEX:
            raise ValueError(f"size must be within 1..{MAX_POD_INDEX}, got {size}")
        if not 1 <= start <= size:
            raise ValueError(f"start must be within 1..{size}, got {start}")
        self.next = itertools.cycle([*range(start, size + 1), *range(1, start)]).__next__
