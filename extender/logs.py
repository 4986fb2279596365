"""Structured logging: one JSON object per line on stderr, shared by the extender and the webhook.

Fields passed with ``extra={...}`` appear as top-level keys of the line.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import Any

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_logging(level: str = "info") -> None:
    """Route every logger to JSON lines on stderr at ``level`` (debug, info, warning, error)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}; use debug, info, warning or error")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    # aiohttp's access log is one line per scheduler call: too chatty at info.
    logging.getLogger("aiohttp.access").setLevel(max(numeric, logging.WARNING))
