"""YAML streams for the offline tools: libyaml's C loader where PyYAML was built with it, errors that name
the file and the line.

The C loader reads a 2,000-pod snapshot several times faster than PyYAML's pure-Python one and builds the
same objects (both are the safe loader: plain data, no Python tags).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import yaml

try:
    from yaml import CSafeLoader as Loader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as Loader  # type: ignore[assignment]

FAST = Loader.__name__ == "CSafeLoader"  # libyaml is there


class YAMLFileError(ValueError):
    """A document that is not YAML, with where: ``pods.yaml:12:3: mapping values are not allowed here``."""


def _where(source: str, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return f"{source}: not valid YAML: {' '.join(str(problem).split())}"
    return f"{source}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {' '.join(str(problem).split())}"


def iter_documents(text: str, source: str) -> Iterator[Any]:
    """The documents of a YAML stream, one at a time; ``YAMLFileError`` naming ``source`` and the line.

    JSON (``kubectl get -o json``) is YAML too; a file that is one JSON document is read by the JSON parser,
    tens of times faster than any YAML loader, and by the YAML loader when it is not strict JSON.
    """
    if text.lstrip()[:1] in ("{", "["):
        try:
            yield orjson.loads(text)
            return
        except orjson.JSONDecodeError:
            pass  # YAML in flow style, or several documents: the YAML loader says what is wrong
    try:
        yield from yaml.load_all(text, Loader=Loader)
    except yaml.YAMLError as exc:
        raise YAMLFileError(_where(source, exc)) from exc
