"""Structured logging: one JSON object per line on stderr, shared by the extender and the webhook.

Fields passed with ``extra={...}`` appear as top-level keys of the line.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from typing import Any

import orjson

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


_MILLIS = tuple(f".{ms:03d}+00:00" for ms in range(1000))  # a line's milliseconds and offset, made once


class Timestamps:
    """``datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")``, with the seconds formatted
    once per second (rounded to microseconds first, as datetime does). One per writer, not thread-safe
    beyond a stale cache (a wrong second is never returned: the text and its second are swapped together).
    A time within the second formatted last costs a subtraction, a rounding and a lookup: ``now - start`` is
    exactly the fraction ``math.modf`` gives, since ``start`` is ``now``'s whole seconds."""

    def __init__(self) -> None:
        self._second: tuple[float, str] = (-2.0, "")  # the start of the second formatted last, its text

    def __call__(self, now: float) -> str:
        start, text = self._second
        fraction = now - start
        if 0.0 <= fraction < 1.0:
            micros = round(fraction * 1_000_000)
            if micros < 1_000_000:
                return text + _MILLIS[micros // 1000]
        fraction, whole = math.modf(now)
        micros = round(fraction * 1_000_000)
        second = int(whole)
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        cached = self._second
        if cached[0] != second:
            cached = self._second = (float(second), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        return cached[1] + _MILLIS[micros // 1000]


def dump_line(line: dict[str, Any]) -> str:
    """One JSON line: orjson's, or the standard library's for what orjson refuses (a lone surrogate in a
    pod's text, a key that is not a string)."""
    try:
        return orjson.dumps(line, default=str).decode()
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(line, default=str)


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._timestamp = Timestamps()

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": self._timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return dump_line(line)


def setup_logging(level: str = "info") -> None:
    """Route every logger to JSON lines on stderr at ``level`` (debug, info, warning, error)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    # Nothing here writes the caller's file and line, thread or process: skip collecting them per record
    # (the logging HOWTO's "Optimization" settings).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # aiohttp's access log is one line per scheduler call: too chatty at info.
    logging.getLogger("aiohttp.access").setLevel(max(numeric, logging.WARNING))


def describe_exception(exc: BaseException, limit: int = 300) -> str:
    """One short line for an unexpected exception: its type, its message (cut to ``limit`` characters, so
    a hostile value quoted in it cannot flood the log) and where it was raised. Used instead of a
    traceback by the request catch-alls: one line per failed request, never the request's data."""
    text = " ".join(str(exc).split())
    if len(text) > limit:
        text = text[:limit] + "..."
    where = ""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" (at {tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno})"
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


class _OneLine(logging.Filter):
    """Turns a record's traceback into one ``error`` field (see ``describe_exception``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.error = describe_exception(record.exc_info[1])
            record.exc_info = None
            record.exc_text = None
        return True


_ONE_LINE = _OneLine()


def one_line_server_errors() -> None:
    """aiohttp answers a body it cannot parse or decode (a broken Content-Encoding, say) with a 400 of its
    own, before any handler runs, and logs the traceback; a stream of such bodies must not become a stream
    of tracebacks. Idempotent."""
    server = logging.getLogger("aiohttp.server")
    if _ONE_LINE not in server.filters:
        server.addFilter(_ONE_LINE)
