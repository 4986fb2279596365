"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel every task, then wait for each to end (whatever it ends with: it is being stopped)."""
    stopping = list(tasks)
    for task in stopping:
        task.cancel()
    for task in stopping:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
