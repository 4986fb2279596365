"""YAML streams for the offline tools: libyaml's C loader where PyYAML was built with it, errors that name
the file and the line.

The C loader reads a 2,000-pod snapshot several times faster than PyYAML's pure-Python one and builds the
same objects (both are the safe loader: plain data, no Python tags).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import orjson
import yaml

try:
    from yaml import CSafeLoader as _Base
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _Base  # type: ignore[assignment]

FAST = _Base.__name__ == "CSafeLoader"  # libyaml is there

_STR, _MAP, _SEQ = "tag:yaml.org,2002:str", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"


class Loader(_Base):
    """The safe loader (libyaml's where there) with a shorter path for what Kubernetes objects are made of:
    plain mappings with string keys, sequences and strings are built directly, everything else (numbers,
    booleans, nulls, timestamps, merge keys, complex keys) by the safe constructor itself. Same objects,
    about twice as fast: the safe constructor's per-node generators were most of a snapshot's load time.
    Nodes an alias reuses are built once (as the safe constructor does), so an alias bomb stays small."""

    def construct_document(self, node: yaml.Node) -> Any:
        memo: dict[int, Any] = {}
        try:
            return self._build(node, memo)
        finally:
            self.constructed_objects, self.recursive_objects, self.state_generators = {}, {}, []

    def _build(self, node: yaml.Node, memo: dict[int, Any]) -> Any:
        key = id(node)
        if key in memo:
            return memo[key]
        tag = node.tag
        if tag == _STR and isinstance(node, yaml.ScalarNode):
            return node.value
        out: Any
        if tag == _MAP and isinstance(node, yaml.MappingNode) and all(
                k.tag == _STR and isinstance(k, yaml.ScalarNode) for k, _ in node.value):
            out = memo[key] = {}
            for k, v in node.value:
                out[k.value] = self._build(v, memo)
        elif tag == _SEQ and isinstance(node, yaml.SequenceNode):
            out = memo[key] = []
            out.extend(self._build(item, memo) for item in node.value)
        else:  # scalars of other types, merge keys, complex keys, sets ...: the safe constructor
            out = memo[key] = self.construct_object(node, deep=True)
        return out


class YAMLFileError(ValueError):
    """A document that is not YAML, with where: ``pods.yaml:12:3: mapping values are not allowed here``."""


# The largest input file the offline tools read: a 10,000-pod snapshot as JSON is about 100 MiB. A bound, so
# that /dev/zero or a wrong path to a disk image is an error, not a process that reads until memory runs out.
MAX_INPUT_BYTES = 512 * 1024 * 1024


class InputFileError(YAMLFileError):
    """A file that cannot be read as text: missing, too large or not UTF-8; the message names the file."""


def read_text_file(path: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The text of ``path`` (``-``: standard input), read at most ``max_bytes`` into memory; an
    ``InputFileError`` naming the file when it cannot be opened, is larger, or is not UTF-8."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(max_bytes + 1)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise InputFileError(f"{path}: {why[:1].lower()}{why[1:]}") from None  # as common.cli's describe()
    if len(data) > max_bytes:
        raise InputFileError(f"{path}: larger than {max_bytes // (1024 * 1024)} MiB; not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputFileError(f"{path}:{line}: not UTF-8 text (byte {exc.start}: "
                             f"{data[exc.start:exc.start + 1]!r})") from None


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
    except ValueError as exc:  # a scalar the constructor cannot convert: an integer of over 4,300 digits
        raise YAMLFileError(f"{source}: not readable YAML: a number is too long "
                            f"({' '.join(str(exc).split())[:120]})") from None
    except RecursionError:
        raise YAMLFileError(f"{source}: not readable YAML: nested too deeply") from None
