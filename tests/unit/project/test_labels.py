"""Every well-known key is defined once: in ``extender.common.labels``, or, for the pod contract, in
``extender.common.contract``. The code names the constant; a key typed out anywhere else is a copy that can
drift."""

from __future__ import annotations

import ast
import re

from extender.common import contract, labels
from tests.unit.fixtures import ROOT

HOMES = {ROOT / "extender" / "common" / "labels.py", ROOT / "extender" / "common" / "contract.py"}
KEY = re.compile(r"(tensor-fusion\.ai|karpenter\.sh|([a-z0-9-]+\.)*kubernetes\.io|nvidia\.com|amd\.com)/"
                 r"[A-Za-z0-9][-A-Za-z0-9_.]*")


def _keys(module: object) -> dict[str, str]:
    """The keys the module defines (not those it imports from labels)."""
    return {name: value for name, value in vars(module).items()
            if name.isupper() and isinstance(value, str) and KEY.fullmatch(value)
            and (module is labels or getattr(labels, name, None) != value)}


def test_no_key_has_two_names() -> None:
    by_value: dict[str, list[str]] = {}
    for module in (labels, contract):
        for name, value in _keys(module).items():
            by_value.setdefault(value, []).append(f"{module.__name__}.{name}")
    # the pool's key is a label on pods and GPUs and an annotation on pods: one value, named for each use
    allowed = {contract.POOL_LABEL}
    twice = {v: names for v, names in by_value.items() if len(set(names)) > 1 and v not in allowed}
    assert not twice, f"defined more than once: {twice}"


def test_no_module_types_out_a_well_known_key() -> None:
    found = []
    for package in ("extender", "webhook"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path in HOMES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                value = node.value if isinstance(node, ast.Constant) else None
                if isinstance(value, str) and KEY.fullmatch(value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {value!r}")
    assert not found, ("import the key from extender.common.labels (or .contract) instead:\n"
                       + "\n".join(found))
