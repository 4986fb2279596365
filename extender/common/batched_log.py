"""Frequent log lines, cheaply: the webhook's line per mutation and per denial, the extender's line per bind.

A line has the fields ``common.logs.JsonFormatter`` writes (ts, level, logger, msg and the extras), so
it reads like every other line, but it is built with one ``orjson.dumps`` (and a timestamp whose seconds are
formatted once a second) instead of a ``LogRecord``, a formatter pass and a locked handler. A caller only
notes its time and fields; the lines are formatted and written together, at most ``FLUSH_AFTER`` seconds
after the first waiting one, or at once when ``MAX_PENDING`` wait (and when the server shuts down), so a
busy server makes a few writes a second instead of one per line. The logger's level decides, as for any log
line (``--log-level``). A caller that writes the same fields again and again (the webhook's replayed answers)
renders them once and passes the rendered members (``render_members``) to ``write_members``: the line is
the same, without a dict or a JSON encoding per line.
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
        # (time, level, msg, fields or rendered members) of the lines waiting: formatted together when written
        self._pending: list[tuple[float, int, str, dict[str, Any] | str]] = []
        self.timestamp = Timestamps()
        # '"level":...,"logger":...,"msg":...' by (level, msg), for lines of rendered members
        self._heads: dict[tuple[int, str], str] = {}

    def write(self, level: int, msg: str, fields: dict[str, Any]) -> None:
        """One line of ``fields`` (which the caller no longer changes), if the logger's level lets it."""
        self.write_members(level, msg, fields)

    def write_members(self, level: int, msg: str, members: dict[str, Any] | str) -> None:
        """``write``, with the fields as a dict or as JSON object members: ``render_members`` of some fields,
        joined by commas with other rendered members such as ``"duration_ms":1.5`` (no braces)."""
        if not self._logger.isEnabledFor(level):
            return
        self._pending.append((time.time(), level, msg, members))
        if len(self._pending) >= MAX_PENDING:
            self.flush()
        elif len(self._pending) == 1:  # the first waiting line schedules the write
            try:
                asyncio.get_running_loop().call_later(FLUSH_AFTER, self.flush)
            except RuntimeError:  # no event loop: write at once
                self.flush()

    def _head(self, level: int, msg: str) -> str:
        """The members after ``ts`` of a line of rendered members: level, logger and msg."""
        head = self._heads.get((level, msg))
        if head is None:
            head = self._heads[(level, msg)] = render_members(
                {"level": logging.getLevelName(level).lower(), "logger": self._logger.name, "msg": msg})
        return head

    def flush(self) -> None:
        if not self._pending:
            return
        lines: list[str] = []
        stamp = self.timestamp
        # one loop, no call per line but the timestamp's: at thousands of lines a second this is the cost
        for now, level, msg, fields in self._pending:
            if isinstance(fields, str):
                members = f",{fields}" if fields else ""
                lines.append(f'{{"ts":"{stamp(now)}",{self._head(level, msg)}{members}}}\n')
            else:
                lines.append(dump_line({"ts": stamp(now), "level": logging.getLevelName(level).lower(),
                                        "logger": self._logger.name, "msg": msg, **fields}) + "\n")
        self._pending.clear()
        stream = self._stream or sys.stderr
        try:
            stream.write("".join(lines))
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream loses log lines, never an answer
            pass


def render_members(fields: dict[str, Any]) -> str:
    """``fields`` as the members of a JSON object (no braces), as a line of ``BatchedLog`` writes them."""
    return dump_line(fields)[1:-1]
