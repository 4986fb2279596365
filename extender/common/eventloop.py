"""The event loop both servers run on.

uvloop (libuv, compiled) instead of asyncio's pure-Python selector loop: the extender's work per pod
is mostly socket and TLS handling around small requests, and in the end-to-end benchmark (300 nodes,
2,000 pods, runs alternated) uvloop cut the extender's CPU per bound pod from 2.85-2.90 ms to 2.35 ms
and raised pods/s by a quarter. Where uvloop is not installed (it does not build on Windows), the
standard loop runs the same code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
