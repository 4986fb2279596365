"""Typed reads of the fields of a user's object (a CRD that keeps unknown fields, a snapshot file): each read
answers the field's value or its default, and a field of the wrong type adds a problem naming the field and
the value to a list the caller reports (an event, a condition, a line of ``plan``). Nothing here raises, so a
parser built from these is total: one malformed object is named, never an exception that stops the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extender.common.numbers import shown

Problems = list[str]


def as_object(raw: object) -> Mapping[str, Any]:
    """``raw`` when it is a mapping, else an empty one (for the object itself, whose type the API ensures)."""
    return raw if isinstance(raw, Mapping) else {}


def wrong(problems: Problems, path: str, raw: object, expected: str) -> None:
    problems.append(f"{path}={shown(raw)}: expected {expected}")


def get_map(parent: Mapping[str, Any], key: str, path: str, problems: Problems) -> Mapping[str, Any]:
    """An object field; {} when absent (None) or, with a problem, when it is not an object."""
    raw = parent.get(key)
    if raw is None:
        return {}
    if isinstance(raw, Mapping):
        return raw
    wrong(problems, path, raw, "an object")
    return {}


def get_list(parent: Mapping[str, Any], key: str, path: str, problems: Problems) -> list[Any]:
    """A list field; [] when absent or, with a problem, when it is not a list."""
    raw = parent.get(key)
    if raw is None:
        return []
    if isinstance(raw, list):
        return raw
    wrong(problems, path, raw, "a list")
    return []


def get_str(parent: Mapping[str, Any], key: str, path: str, problems: Problems, default: str = "") -> str:
    """A string field; ``default`` when absent or empty or, with a problem, when it is not a string."""
    raw = parent.get(key)
    if raw is None or raw == "":
        return default
    if isinstance(raw, str):
        return raw
    wrong(problems, path, raw, "a string")
    return default


def get_string_map(parent: Mapping[str, Any], key: str, path: str, problems: Problems) -> dict[str, str]:
    """A map of strings (labels, annotations); entries whose value is not a string (a number or a boolean
    are taken as their YAML text) are left out with a problem each."""
    out: dict[str, str] = {}
    for k, v in get_map(parent, key, path, problems).items():
        if isinstance(v, str):
            out[str(k)] = v
        elif isinstance(v, bool):
            out[str(k)] = "true" if v else "false"
        elif isinstance(v, int | float) and v == v and v not in (float("inf"), float("-inf")):
            out[str(k)] = str(v)
        else:
            wrong(problems, f"{path}.{k}", v, "a string")
    return out
