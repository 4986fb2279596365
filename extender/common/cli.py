"""What every command line of the project shares: errors as one line, with argparse's exit codes.

argparse prints the whole usage before a usage error (51 lines for ``serve``); a user wants the one line
that names the flag, and ``--help`` for the rest. Runtime failures are one line too, naming the file,
the API server or the resource at fault, never a traceback. Exit codes follow argparse's convention:
2 for usage (a bad flag, an unreadable or malformed input file), 1 for anything that failed afterwards.
Imports nothing but the standard library (``--version`` stays fast).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr (exit 2); its subparsers too."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace, newlines included, as one space."""
    return " ".join(str(text).split())


def describe(exc: BaseException) -> str:
    """A user's one-line account of a failure: the file, the API server or the HTTP answer at fault."""
    if isinstance(exc, OSError) and getattr(exc, "filename", None) is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror[:1].lower()}{exc.strerror[1:]}"
    unreachable = _unreachable(exc)
    if unreachable is not None:
        return unreachable
    return one_line(str(exc)) or type(exc).__name__


def _unreachable(exc: BaseException) -> str | None:
    """urllib3's MaxRetryError (told apart by shape: this module imports no HTTP library) as "cannot reach
    the API server at URL: why"."""
    pool = getattr(exc, "pool", None)
    host = getattr(pool, "host", None)
    if host is None or not hasattr(exc, "reason"):
        return None
    scheme = getattr(pool, "scheme", "https")
    port = getattr(pool, "port", None)
    reason = getattr(exc, "reason", None)
    why = _reason(reason) if reason is not None else "no answer"
    return f"cannot reach the API server at {scheme}://{host}{f':{port}' if port else ''}: {why}"


def _reason(reason: BaseException) -> str:
    text = one_line(str(reason))
    for marker, plain in (("Connection refused", "connection refused"), ("timed out", "timed out"),
                          ("Name or service not known", "unknown host"),
                          ("nodename nor servname", "unknown host"),
                          ("CERTIFICATE_VERIFY_FAILED", "its TLS certificate is not trusted"),
                          ("No route to host", "no route to host")):
        if marker in text:
            return plain
    return text.rsplit(": ", 1)[-1] if ": " in text else text


def fail(prog: str, message: str, code: int = EXIT_FAILED) -> int:
    """Print ``prog: error: message`` as one line on stderr; return ``code``."""
    print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
    return code
