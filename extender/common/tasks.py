"""Stopping background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence


async def cancel_and_wait(tasks: Sequence[asyncio.Task[None]]) -> None:
    """Cancel every task, then wait for each to end (whatever it ends with: it is being stopped)."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
