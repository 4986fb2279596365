"""One object at a time: the per-object isolation of the reconcilers that act on many objects in one pass.

A whole-picture reconcile (every pool, every claim) used to be one comprehension: one object whose fields
made a parser raise stopped the pass for every object, every round. :class:`Isolation` runs a step per object
instead; an object whose step raises, or whose parser names a problem, is

- logged once per change (of the object's ``resourceVersion`` or of the problem), not once per pass;
- reported on the object a user describes: a Warning event ``Invalid<Kind>`` (``InvalidGPUPool``) naming the
  object, the field and the value, and, where the package gives one, a condition (``condition``);
- left out of this pass, and only it: the other objects go on.

An object that reads well again is forgotten, so the next problem it has is reported again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from extender.common.logs import describe_exception

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Recorder(Protocol):
    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None: ...


Condition = Callable[[Mapping[str, Any], str | None], Awaitable[None]]


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace/name, resourceVersion) of an object, whatever its metadata holds."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    name = name if isinstance(name, str) else "?"
    key = f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name
    version = meta.get("resourceVersion")
    return key, version if isinstance(version, str) else ""


class Isolation:
    """Per-object steps for one controller and one kind of object (see the module's doc)."""

    def __init__(self, controller: str, kind: str, recorder: Recorder | None = None, *,
                 condition: Condition | None = None) -> None:
        self.controller = controller
        self.kind = kind
        self.reason = f"Invalid{kind}"
        self.recorder = recorder
        self.condition = condition
        self._reported: dict[str, tuple[str, str]] = {}  # object -> (resourceVersion, message) reported
        self._pending: dict[str, tuple[Mapping[str, Any], str | None]] = {}  # conditions not yet written

    @property
    def invalid(self) -> dict[str, str]:
        """The objects reported and not yet read well again, with their message."""
        return {key: message for key, (_, message) in self._reported.items()}

    def each(self, objects: Iterable[T], step: Callable[[T], R]) -> list[tuple[T, R]]:
        """``step`` on every object, in order; the objects whose step raised are reported and left out."""
        out = []
        for obj in objects:
            try:
                out.append((obj, step(obj)))
            except Exception as exc:
                self.report(obj, f"cannot be read: {describe_exception(exc, 200)}")  # type: ignore[arg-type]
        return out

    async def each_async(self, objects: Iterable[T], step: Callable[[T], Awaitable[R]]) -> list[tuple[T, R]]:
        """``each`` for a step that awaits (an action on the cluster per object)."""
        out = []
        for obj in objects:
            try:
                out.append((obj, await step(obj)))
            except Exception as exc:
                # not the object's fault, perhaps (an API or cloud error): reported as a failure, not invalid
                self.report(obj, f"not reconciled: {describe_exception(exc, 200)}",  # type: ignore[arg-type]
                            reason="ReconcileFailed")
        return out

    def report(self, obj: Mapping[str, Any], message: str, reason: str | None = None) -> bool:
        """A named problem of ``obj`` (``field=value: why``): logged, an event and a condition, once per
        change; True when it was new."""
        key, version = object_key(obj)
        if self._reported.get(key) == (version, message):
            return False
        self._reported[key] = (version, message)
        log.warning("object skipped", extra={"controller": self.controller, "kind": self.kind, "object": key,
                                             "error": message})
        if self.recorder is not None:
            try:
                self.recorder.record(dict(obj), reason or self.reason, f"{self.kind} {key}: {message}"[:1000],
                                     "Warning")
            except Exception as exc:  # an event is best effort; the object is still left out, the rest go on
                log.warning("event not recorded",
                            extra={"object": key, "error": describe_exception(exc, 200)})
        if self.condition is not None and reason is None:
            self._pending[key] = (obj, message)
        return True

    def ok(self, obj: Mapping[str, Any]) -> None:
        """``obj`` reads well (again): a later problem is reported anew, and its condition is cleared."""
        key, _ = object_key(obj)
        if self._reported.pop(key, None) is not None and self.condition is not None:
            self._pending[key] = (obj, None)

    async def flush(self) -> None:
        """Write the conditions that changed (``condition(obj, message)``; message None: valid again)."""
        if self.condition is None:
            return
        pending, self._pending = self._pending, {}
        for obj, message in pending.values():
            try:
                await self.condition(obj, message)
            except Exception as exc:
                log.warning("condition not written", extra={"controller": self.controller, "kind": self.kind,
                                                            "object": object_key(obj)[0],
                                                            "error": describe_exception(exc, 200)})
