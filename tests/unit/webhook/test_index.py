"""The pod index allocator: indices 1 to 128 in turn, unique across threads, and only valid ranges."""

from __future__ import annotations

import threading

import pytest

from webhook.index import IndexAllocator


def test_indices_cycle_through_1_to_128() -> None:
    allocator = IndexAllocator()
    assert [allocator.next() for _ in range(130)] == [*range(1, 129), 1, 2]


def test_indices_are_unique_across_threads() -> None:
    allocator = IndexAllocator()
    seen: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(16):
            value = allocator.next()
            with lock:
                seen.append(value)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == list(range(1, 129))


@pytest.mark.parametrize(("start", "size"), [(0, 128), (129, 128), (1, 0), (1, 200)])
def test_allocator_rejects_bad_ranges(start: int, size: int) -> None:
    with pytest.raises(ValueError, match="must be within"):
        IndexAllocator(start, size)

