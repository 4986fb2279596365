"""A GPUPool's provisioning settings, parsed once: mode, capacity targets, node provisioner, compaction.

Problems (a malformed quantity, an incomplete NodeClass reference) are collected, not raised, so that
one bad pool never stops the others; the controller reports them as events.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.common.labels import MANUAL_COMPACTION
from extender.common.timefmt import parse_duration, parse_time
from extender.planning.amounts import UNLIMITED, Amount, CapacityError, parse_amount

DEFAULT_COMPACTION_PERIOD = 300.0


class ProvisioningMode(StrEnum):
    PROVISIONED = "Provisioned"
    AUTO_SELECT = "AutoSelect"
    KARPENTER = "Karpenter"


@dataclass(frozen=True)
class NodeClassRef:
    group: str
    kind: str
    version: str
    name: str

    def as_json(self) -> dict[str, str]:
        return {"group": self.group, "kind": self.kind, "name": self.name}

    @property
    def plural(self) -> str:
        lower = self.kind.lower()
        return lower + ("es" if lower.endswith(("s", "x", "ch", "sh")) else "s")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class PoolConfig:
    name: str
    mode: ProvisioningMode
    min: Amount | None = None
    warm: Amount | None = None
    max: Amount | None = None
    requirements: tuple[Requirement, ...] = ()
    node_class: NodeClassRef | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    compaction_period: float = DEFAULT_COMPACTION_PERIOD
    manual_compaction: dt.datetime | None = None
    problems: tuple[str, ...] = ()
    uid: str = ""
    # Provisioned mode: the GPUNodeClass the extender launches VMs from ("": nodes are added by the user)
    gpu_node_class: str = ""

    @property
    def launches_vms(self) -> bool:
        return self.mode is ProvisioningMode.PROVISIONED and bool(self.gpu_node_class)


def _string_map(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, Mapping) else {}


def pool_config(obj: Mapping[str, Any]) -> PoolConfig:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    manager = spec.get("nodeManagerConfig") or {}
    capacity = spec.get("capacityConfig") or {}
    provisioner = manager.get("nodeProvisioner") or {}
    problems: list[str] = []
    try:
        mode = ProvisioningMode(str(manager.get("provisioningMode") or ProvisioningMode.AUTO_SELECT))
    except ValueError:
        problems.append(f"nodeManagerConfig.provisioningMode={manager.get('provisioningMode')!r}: "
                        f"expected one of {', '.join(m.value for m in ProvisioningMode)}")
        mode = ProvisioningMode.PROVISIONED  # unknown: touch nothing

    targets: dict[str, Amount | None] = {}
    for key in ("minResources", "warmResources", "maxResources"):
        try:
            targets[key] = parse_amount(capacity.get(key), f"capacityConfig.{key}")
        except CapacityError as exc:
            problems.append(str(exc))
            targets[key] = None
    raw_max = capacity.get("maxResources")
    cap = targets["maxResources"]
    if cap is not None and isinstance(raw_max, Mapping):  # a dimension not named has no cap
        targets["maxResources"] = Amount(
            cap.tflops if raw_max.get("tflops") is not None else UNLIMITED.tflops,
            cap.vram if raw_max.get("vram") is not None else UNLIMITED.vram)

    requirements = []
    for i, item in enumerate(provisioner.get("gpuRequirements") or []):
        if not isinstance(item, Mapping) or not item.get("key"):
            problems.append(f"nodeProvisioner.gpuRequirements[{i}]: needs a key")
            continue
        values = item.get("values") or []
        requirements.append(Requirement(str(item["key"]), str(item.get("operator") or "In"),
                                        tuple(str(v) for v in values)))

    node_class = None
    ref = provisioner.get("karpenterNodeClassRef")
    if mode is ProvisioningMode.KARPENTER:
        fields = {k: str((ref or {}).get(k) or "") for k in ("group", "kind", "version", "name")}
        missing = [k for k, v in fields.items() if not v]
        if not isinstance(ref, Mapping) or missing:
            problems.append("nodeProvisioner.karpenterNodeClassRef: needs group, kind, version and name"
                            + (f" (missing {', '.join(missing)})" if missing else ""))
        else:
            node_class = NodeClassRef(**fields)

    gpu_node_class = ""
    raw_class = provisioner.get("nodeClass")
    if mode is ProvisioningMode.PROVISIONED and raw_class is not None:
        if isinstance(raw_class, str) and raw_class.strip():
            gpu_node_class = raw_class.strip()
        else:
            problems.append(f"nodeProvisioner.nodeClass={raw_class!r}: expected the name of a GPUNodeClass")

    taints = tuple(
        {"key": str(t.get("key")), "value": str(t.get("value") or ""),
         "effect": str(t.get("effect") or "NoSchedule")}
        for t in provisioner.get("gpuTaints") or [] if isinstance(t, Mapping) and t.get("key"))

    period = DEFAULT_COMPACTION_PERIOD
    raw_period = (manager.get("nodeCompaction") or {}).get("period")
    if raw_period:
        try:
            period = parse_duration(str(raw_period)).total_seconds()
        except ValueError as exc:
            problems.append(f"nodeCompaction.period: {exc}")
    annotations = meta.get("annotations") or {}
    return PoolConfig(
        name=str(meta.get("name") or ""), mode=mode, min=targets["minResources"],
        warm=targets["warmResources"], max=targets["maxResources"], requirements=tuple(requirements),
        node_class=node_class, labels=_string_map(provisioner.get("gpuNodeLabels")),
        annotations=_string_map(provisioner.get("gpuNodeAnnotations")), taints=taints,
        compaction_period=max(period, 1.0), manual_compaction=parse_time(annotations.get(MANUAL_COMPACTION)),
        problems=tuple(problems), uid=str(meta.get("uid") or ""), gpu_node_class=gpu_node_class,
    )
