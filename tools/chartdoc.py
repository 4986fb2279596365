"""The chart's README.md and values.schema.json, both from ``values.yaml``: its comments and defaults.

The comment lines directly above a key (and one after its value) describe it; a ``# @schema {...}`` line
there is JSON Schema for that key, merged over what its default implies (a given ``type`` replaces the
implied one and stops the descent into a mapping: a free-form object such as ``resources``). Every mapping
with keys is closed (``additionalProperties: false``), so that ``helm lint --strict``, ``helm install`` and
``helm upgrade`` reject a misspelt key; an empty mapping (``nodeSelector: {}``) is free-form.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CHART = Path("charts/tensor-fusion-extender")
VALUES_FILE = CHART / "values.yaml"
README_FILE = CHART / "README.md"
SCHEMA_FILE = CHART / "values.schema.json"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_.-]*):(?P<rest>.*)$")
_SCHEMA = "@schema"
# Shared definitions a ``$ref`` may name.
DEFS: dict[str, Any] = {
    "duration": {
        "description": "a Go duration: 30s, 5m, 1h30m (a bare number is read as seconds, deprecated)",
        "anyOf": [{"type": "string", "pattern": r"^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$"},
                  {"type": "number", "exclusiveMinimum": 0}],
    },
}


class ValuesDocError(ValueError):
    """values.yaml has a comment annotation that cannot be read; the message names the line."""


@dataclass
class Entry:
    path: tuple[str, ...]
    line: int
    comment: list[str] = field(default_factory=list)
    schema: dict[str, Any] = field(default_factory=dict)


def _trailing_comment(rest: str) -> str:
    """The ``# ...`` after a key's value, outside quotes."""
    quote = None
    for i, ch in enumerate(rest):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1] == " "):
            return rest[i + 1:].strip()
    return ""


def entries(text: str, source: str = str(VALUES_FILE)) -> dict[tuple[str, ...], Entry]:
    """Every key of ``text`` (a values file) by its path, with its comment lines and schema annotation."""
    out: dict[tuple[str, ...], Entry] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    schema: dict[str, Any] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped:
            comment, schema = [], {}
            continue
        if stripped.startswith("#"):
            body = stripped[1:].strip()
            if body.startswith(_SCHEMA):
                try:
                    schema = {**schema, **json.loads(body[len(_SCHEMA):])}
                except json.JSONDecodeError as exc:
                    raise ValuesDocError(f"{source}:{number}: @schema is not JSON: {exc}") from None
            else:
                comment.append(body)
            continue
        match = _KEY.match(raw)
        if not match:  # a list item or a continuation: not a key of its own
            comment, schema = [], {}
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = (*(key for _, key in stack), match["key"])
        trailing = _trailing_comment(match["rest"])
        out[path] = Entry(path, number, [*comment, *([trailing] if trailing else [])], schema)
        stack.append((indent, match["key"]))
        comment, schema = [], {}
    return out


def _implied(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if isinstance(value, list):
        kinds = {json.dumps(_implied(v)) for v in value}
        return {"type": "array", **({"items": json.loads(kinds.pop())} if len(kinds) == 1 else {})}
    if value is None:
        return {}
    return {"type": "object"}


def _schema_of(path: tuple[str, ...], value: Any, docs: dict[tuple[str, ...], Entry]) -> dict[str, Any]:
    entry = docs.get(path)
    given = dict(entry.schema) if entry else {}
    description = " ".join(entry.comment) if entry and entry.comment else ""
    if "type" in given or "$ref" in given or "enum" in given:
        schema = given
        if "$ref" in schema:
            schema["$ref"] = schema["$ref"]
    else:
        schema = {**_implied(value), **given}
        if isinstance(value, dict) and value:
            schema["additionalProperties"] = False
            schema["properties"] = {k: _schema_of((*path, k), v, docs) for k, v in value.items()}
    if description and "$ref" not in schema:
        schema = {"description": description, **schema}
    return schema


def values_schema(text: str) -> dict[str, Any]:
    values = yaml.safe_load(text) or {}
    docs = entries(text)
    top = {k: _schema_of((k,), v, docs) for k, v in values.items()}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "tensor-fusion-extender chart values", "type": "object",
            "additionalProperties": False, "properties": top, "$defs": DEFS}


def schema_json(text: str) -> str:
    return json.dumps(values_schema(text), indent=2, ensure_ascii=False) + "\n"


def _default_cell(value: Any) -> str:
    if isinstance(value, dict) and not value:
        return "`{}`"
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else json.dumps(value)
    return "`" + text.replace("|", "\\|") + "`"


def _leaves(value: Any, path: tuple[str, ...], docs: dict[tuple[str, ...], Entry]
            ) -> list[tuple[tuple[str, ...], Any]]:
    entry = docs.get(path)
    freeform = entry is not None and entry.schema.get("type") == "object"
    if isinstance(value, dict) and value and not freeform:
        out: list[tuple[tuple[str, ...], Any]] = []
        for key, sub in value.items():
            out += _leaves(sub, (*path, key), docs)
        return out
    return [(path, value)]


def readme(text: str, header: str) -> str:
    values = yaml.safe_load(text) or {}
    docs = entries(text)
    lines = [header.rstrip("\n"), "", "# tensor-fusion-extender chart", "",
             "Fractional GPU sharing on stock Kubernetes: the `tf-webhook` admission webhook and "
             "kube-scheduler with the `tf-extender` sidecar. How to install and what each piece does: "
             "[docs/install.md](../../docs/install.md).", "",
             "```sh", "helm install tfe charts/tensor-fusion-extender --namespace tensor-fusion-sys "
             "--create-namespace \\", "  --set image.repository=registry.example.com/tensor-fusion-extender "
             "--set image.tag=0.1.0", "```", "",
             "`values.schema.json` holds every key below: Helm refuses a misspelt or unknown key and a "
             "value of the wrong kind. Durations are Go durations (`30s`, `5m`). The `extender`, "
             "`defrag`, `capacity`, `expansion`, `clusterAutoscaler` and `webhook` values are the flags "
             "of `tf-extender serve` and `tf-webhook serve` "
             "([flag reference](../../docs/reference/flags.md)); a value equal to the "
             "program's default passes no flag.", "", "## Values", ""]
    for key, value in values.items():
        lines += [f"### `{key}`", ""]
        top = docs.get((key,))
        if top and top.comment:
            lines += [" ".join(top.comment), ""]
        lines += ["| key | default | description |", "|---|---|---|"]
        for path, leaf in _leaves(value, (key,), docs):
            entry = docs.get(path)
            text_ = " ".join(entry.comment) if entry and path != (key,) else ""
            parent = docs.get(path[:-1]) if len(path) > 2 else None
            if parent and parent.comment and path[-1] == next(iter(_dict_at(values, path[:-1]))):
                text_ = (" ".join(parent.comment) + " " + text_).strip()
            cell = text_.replace("|", "\\|")
            lines.append(f"| `{'.'.join(path)}` | {_default_cell(leaf)} | {cell} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def _dict_at(values: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node: Any = values
    for key in path:
        node = node[key]
    return node if isinstance(node, dict) else {}
