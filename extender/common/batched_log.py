"""Frequent log lines, cheaply: the webhook's line per mutation and per denial, the extender's line per bind.

A line has the fields ``common.logs.JsonFormatter`` writes (ts, level, logger, msg and the extras), so
it reads like every other line, but it is built with one ``orjson.dumps`` (and a timestamp whose seconds are
formatted once a second) instead of a ``LogRecord``, a formatter pass and a locked handler. A caller only
notes its time and fields; the lines are formatted and written together, at most ``FLUSH_AFTER`` seconds
after the first waiting one, or at once when ``MAX_PENDING`` wait (and when the server shuts down), so a
busy server makes a few writes a second instead of one per line. The logger's level decides, as for any log
line (``--log-level``).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import Any, TextIO

from extender.common.logs import Timestamps, dump_line

FLUSH_AFTER = 0.05
MAX_PENDING = 256


class BatchedLog:
    def __init__(self, logger: logging.Logger, stream: TextIO | None = None) -> None:
        self._logger = logger
        self._stream = stream  # None: sys.stderr at the time of writing (as a StreamHandler's default)
        # (time, level, msg, fields) of the lines waiting: formatted together when written
        self._pending: list[tuple[float, int, str, dict[str, Any]]] = []
        self.timestamp = Timestamps()

    def write(self, level: int, msg: str, fields: dict[str, Any]) -> None:
        """One line of ``fields`` (which the caller no longer changes), if the logger's level lets it."""
        if not self._logger.isEnabledFor(level):
            return
        self._pending.append((time.time(), level, msg, fields))
        if len(self._pending) >= MAX_PENDING:
            self.flush()
        elif len(self._pending) == 1:  # the first waiting line schedules the write
            try:
                asyncio.get_running_loop().call_later(FLUSH_AFTER, self.flush)
            except RuntimeError:  # no event loop: write at once
                self.flush()

    def _format(self, now: float, level: int, msg: str, fields: dict[str, Any]) -> str:
        return dump_line({"ts": self.timestamp(now), "level": logging.getLevelName(level).lower(),
                          "logger": self._logger.name, "msg": msg, **fields})

    def flush(self) -> None:
        if not self._pending:
            return
        text = "".join(f"{self._format(*line)}\n" for line in self._pending)
        self._pending.clear()
        stream = self._stream or sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream loses log lines, never an answer
            pass
