"""``-o table|json|yaml``: the one output switch of every command that reads and reports (status, plan,
simulate)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

FORMATS = ("table", "json", "yaml")


def add_output_argument(parser: argparse.ArgumentParser, default: str, json_form: str) -> None:
    parser.add_argument("-o", "--output", default=default, choices=FORMATS,
                        help=f"table: columns for people; json: {json_form}; yaml: the same as one YAML "
                             f"document (default {default})")


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str],
          headers: Mapping[str, str] | None = None) -> str:
    """Left-aligned columns named in upper case (or as ``headers`` names them); a list cell joined with
    commas, a missing one as ``-``."""
    cells = [[(headers or {}).get(c, c.upper()) for c in columns]]
    for row in rows:
        cells.append([_cell(row.get(c)) for c in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() + "\n"
                   for line in cells)


def _cell(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return str(value)


def json_lines(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(dict(row), default=str) + "\n" for row in rows)


def yaml_document(data: Any) -> str:
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
