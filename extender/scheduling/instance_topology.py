"""The GPU topology of known cloud instance types, for nodes whose GPUs come from feature-discovery labels.

GPU Feature Discovery labels say how many GPUs a node has, not how they are linked. For the instance types
below, the cloud's own documentation says it: which GPUs share an NVLink/NVSwitch fabric and which NUMA node
(CPU socket) each GPU hangs off. A node's ``node.kubernetes.io/instance-type`` label picks the entry; a
ConfigMap (``instance-topology.yaml``, same shape as ``parse_table`` reads) adds or replaces entries.

Each entry names its source. NUMA layouts of two-socket machines follow the usual PCIe layout (the first
half of the GPUs on socket 0); where that is the only assumption, the entry says so. On an NVSwitch machine
every pair is tier 0, so the NUMA layout changes no choice there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from extender.scheduling.topology import Link, Plan, Settings, Tier, TopologyMode, choose, hard_verdict

CONFIGMAP_KEY = "instance-topology.yaml"


class TableError(ValueError):
    """A bad table entry, named by instance type and field."""


@dataclass(frozen=True)
class Shape:
    gpus: int
    nvlink_pairs: frozenset[tuple[int, int]]  # (a, b) with a < b: NVLinked GPU indices
    numa: tuple[int, ...] | None  # per GPU index; None when not known
    source: str

    def topology(self, index: int) -> tuple[int | None, tuple[tuple[int, int], ...]]:
        """GPU ``index``'s NUMA node and its NVLink peers (index, tier)."""
        numa = self.numa[index] if self.numa is not None and index < len(self.numa) else None
        peers = tuple((b if a == index else a, int(Tier.NVLINK)) for a, b in sorted(self.nvlink_pairs)
                      if index in (a, b))
        return numa, peers

    def links(self, index: int, uuid_of: Any) -> tuple[Link, ...]:
        return tuple(Link(uuid_of(peer), tier) for peer, tier in self.topology(index)[1])


def _all_pairs(groups: Iterable[Iterable[int]]) -> frozenset[tuple[int, int]]:
    return frozenset(p for g in groups for p in itertools.combinations(sorted(g), 2))


def _halves(n: int) -> tuple[int, ...]:
    return tuple(0 if i < n // 2 else 1 for i in range(n))


def _nvswitch(n: int, source: str) -> Shape:
    return Shape(n, _all_pairs([range(n)]), _halves(n), source)


AWS_P3 = "https://aws.amazon.com/ec2/instance-types/p3/ (NVLink hybrid cube-mesh, as NVIDIA's DGX-1 V100)"
AWS_P4 = "https://aws.amazon.com/ec2/instance-types/p4/ (8 A100, NVSwitch 600 GB/s all-to-all)"
AWS_P5 = "https://aws.amazon.com/ec2/instance-types/p5/ (8 H100/H200, NVSwitch 900 GB/s all-to-all)"
AWS_G5 = ("https://aws.amazon.com/ec2/instance-types/g5/ (A10G on PCIe, no NVLink; NUMA halves assumed "
          "for the two-socket 48xlarge)")
GCP_A2 = "https://cloud.google.com/compute/docs/gpus#a100-gpus (A100 with NVSwitch, all GPUs one fabric)"
GCP_A3 = "https://cloud.google.com/compute/docs/gpus#h100-gpus (8 H100 with NVSwitch)"
AZURE_ND_A100 = ("https://learn.microsoft.com/azure/virtual-machines/nda100-v4-series (8 A100, NVLink 3.0 "
                 "through NVSwitch)")
AZURE_ND_H100 = ("https://learn.microsoft.com/azure/virtual-machines/nd-h100-v5-series (8 H100, NVLink 4.0 "
                 "through NVSwitch)")

# p3.16xlarge / p3dn.24xlarge: two fully linked quads (0-3, 4-7) and GPU i linked to GPU i+4
_CUBE_MESH = _all_pairs([range(4), range(4, 8)]) | frozenset((i, i + 4) for i in range(4))

BUILT_IN: dict[str, Shape] = {
    "p3.16xlarge": Shape(8, _CUBE_MESH, _halves(8), AWS_P3),
    "p3dn.24xlarge": Shape(8, _CUBE_MESH, _halves(8), AWS_P3),
    "p4d.24xlarge": _nvswitch(8, AWS_P4),
    "p4de.24xlarge": _nvswitch(8, AWS_P4),
    "p5.48xlarge": _nvswitch(8, AWS_P5),
    "p5e.48xlarge": _nvswitch(8, AWS_P5),
    "p5en.48xlarge": _nvswitch(8, AWS_P5),
    "g5.48xlarge": Shape(8, frozenset(), _halves(8), AWS_G5),
    "a2-highgpu-8g": _nvswitch(8, GCP_A2),
    "a2-ultragpu-8g": _nvswitch(8, GCP_A2),
    "a2-megagpu-16g": _nvswitch(16, GCP_A2),
    "a3-highgpu-8g": _nvswitch(8, GCP_A3),
    "a3-megagpu-8g": _nvswitch(8, GCP_A3),
    "Standard_ND96asr_v4": _nvswitch(8, AZURE_ND_A100),
    "Standard_ND96amsr_A100_v4": _nvswitch(8, AZURE_ND_A100),
    "Standard_ND96isr_H100_v5": _nvswitch(8, AZURE_ND_H100),
}


def _indices(name: str, field: str, raw: Any, gpus: int) -> list[int]:
    if not isinstance(raw, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in raw):
        raise TableError(f"{name}: {field} must be a list of GPU indices, got {raw!r}")
    bad = [i for i in raw if not 0 <= i < gpus]
    if bad:
        raise TableError(f"{name}: {field} has index {bad[0]} outside 0..{gpus - 1}")
    return raw


def parse_entry(name: str, raw: Any) -> Shape:
    """One entry: ``gpus``, ``nvlinkGroups`` (lists of fully linked indices), ``nvlinkPairs``, ``numa``
    (one NUMA node per GPU), ``source``."""
    if not isinstance(raw, Mapping):
        raise TableError(f"{name}: an entry is a map, got {raw!r}")
    gpus = raw.get("gpus")
    if not isinstance(gpus, int) or isinstance(gpus, bool) or not 1 <= gpus <= 64:
        raise TableError(f"{name}: gpus must be 1..64, got {gpus!r}")
    groups = raw.get("nvlinkGroups") or []
    pairs = raw.get("nvlinkPairs") or []
    if not isinstance(groups, list) or not isinstance(pairs, list):
        raise TableError(f"{name}: nvlinkGroups and nvlinkPairs are lists of index lists")
    linked = _all_pairs(_indices(name, "nvlinkGroups", g, gpus) for g in groups)
    for pair in pairs:
        indices = _indices(name, "nvlinkPairs", pair, gpus)
        if len(indices) != 2 or indices[0] == indices[1]:
            raise TableError(f"{name}: nvlinkPairs entries are two different indices, got {pair!r}")
        a, b = indices
        linked |= {(min(a, b), max(a, b))}
    numa_raw = raw.get("numa")
    numa = None
    if numa_raw is not None:
        if not isinstance(numa_raw, list) or len(numa_raw) != gpus or not all(
                isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numa_raw):
            raise TableError(f"{name}: numa must list one NUMA node (>= 0) per GPU, got {numa_raw!r}")
        numa = tuple(numa_raw)
    return Shape(gpus, frozenset(linked), numa, str(raw.get("source") or ""))


def parse_table(text: str) -> dict[str, Shape]:
    """The entries of a ConfigMap's ``instance-topology.yaml``: a map from instance type to entry."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TableError(f"{CONFIGMAP_KEY} is not YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise TableError(f"{CONFIGMAP_KEY} must map instance types to entries")
    return {str(name): parse_entry(str(name), raw) for name, raw in document.items()}


def table(overrides: Mapping[str, Shape] | None = None) -> dict[str, Shape]:
    return {**BUILT_IN, **(overrides or {})}


def from_configmap(obj: Mapping[str, Any] | None) -> dict[str, Shape]:
    """The table a ConfigMap makes: the built-in entries, then its ``instance-topology.yaml`` (no
    ConfigMap: the built-in ones). Raises ``TableError`` naming the ConfigMap, the entry and the field."""
    if obj is None:
        return table()
    meta = obj.get("metadata") or {}
    where = f"ConfigMap {meta.get('namespace', '')}/{meta.get('name', '')}"
    text = (obj.get("data") or {}).get(CONFIGMAP_KEY)
    if not isinstance(text, str):
        raise TableError(f"{where}: needs the key {CONFIGMAP_KEY}")
    try:
        return table(parse_table(text))
    except TableError as exc:
        raise TableError(f"{where}: {exc}") from None


def instance_meets(instance_type: str, gpus: int, count: int, settings: Settings,
                   shapes: Mapping[str, Shape] | None = None) -> bool:
    """Whether a new node of ``instance_type`` (``gpus`` GPUs) gives a ``count``-GPU pod a GPU set its
    topology settings accept: always in soft mode; in hard mode by the table's tier (3 when the table does
    not know the type)."""
    if settings.mode is not TopologyMode.HARD:
        return True
    shape = (shapes if shapes is not None else BUILT_IN).get(instance_type)
    tier = tier_for(shape, count) if shape is not None and shape.gpus == gpus else int(Tier.UNKNOWN)
    return hard_verdict(Plan((), Tier(tier)), settings) is None


def tier_for(shape: Shape, count: int) -> int:
    """The best tier a ``count``-GPU pod can get on an empty node of this shape (expansion's question)."""
    if count > shape.gpus or count < 1:
        return int(Tier.UNKNOWN)

    @dataclass(frozen=True)
    class _G:
        name: str
        uuid: str
        numa_node: int | None
        links: tuple[Link, ...]

    gpus = [_G(f"{i:03d}", str(i), shape.topology(i)[0], shape.links(i, str)) for i in range(shape.gpus)]
    return int(choose(gpus, count).tier)
