"""A GPUPool's provisioning settings, parsed once: mode, capacity targets, node provisioner, compaction.

Problems (a malformed quantity, an incomplete NodeClass reference) are collected, not raised, so that
one bad pool never stops the others; the controller reports them as events.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from extender.common.fields import as_object, get_list, get_map, get_str, get_string_map
from extender.common.labels import MANUAL_COMPACTION
from extender.common.logs import describe_exception
from extender.common.numbers import shown
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


def pool_config(obj: Mapping[str, Any]) -> PoolConfig:
    """The pool's settings; total: a field of the wrong type is a problem naming it, and anything this
    parser did not foresee is one too (the pool is then left alone, as any pool with a problem is)."""
    try:
        return _pool_config(obj)
    except Exception as exc:  # a backstop: every field below is read through a typed getter
        name = as_object(as_object(obj).get("metadata")).get("name")
        return PoolConfig(name=name if isinstance(name, str) else "", mode=ProvisioningMode.PROVISIONED,
                          problems=(f"cannot be read: {describe_exception(exc, 200)}",))


def _pool_config(obj: Mapping[str, Any]) -> PoolConfig:
    problems: list[str] = []
    obj = as_object(obj)
    meta = get_map(obj, "metadata", "metadata", problems)
    spec = get_map(obj, "spec", "spec", problems)
    manager = get_map(spec, "nodeManagerConfig", "nodeManagerConfig", problems)
    capacity = get_map(spec, "capacityConfig", "capacityConfig", problems)
    provisioner = get_map(manager, "nodeProvisioner", "nodeProvisioner", problems)
    raw_mode = manager.get("provisioningMode")
    try:
        mode = ProvisioningMode(raw_mode if raw_mode not in (None, "") else ProvisioningMode.AUTO_SELECT)
    except (ValueError, TypeError):
        problems.append(f"nodeManagerConfig.provisioningMode={shown(raw_mode)}: "
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
    for i, item in enumerate(get_list(provisioner, "gpuRequirements", "nodeProvisioner.gpuRequirements",
                                      problems)):
        where = f"nodeProvisioner.gpuRequirements[{i}]"
        if not isinstance(item, Mapping) or not item.get("key"):
            problems.append(f"{where}={shown(item)}: needs a key")
            continue
        key = get_str(item, "key", f"{where}.key", problems)
        operator = get_str(item, "operator", f"{where}.operator", problems, "In")
        values = get_list(item, "values", f"{where}.values", problems)
        bad = [v for v in values if not isinstance(v, str | int | float) or isinstance(v, bool)
               or (isinstance(v, float) and not math.isfinite(v))]
        if bad:
            problems.append(f"{where}.values={shown(values)}: expected a list of strings")
        if key:
            requirements.append(Requirement(key, operator, tuple(str(v) for v in values if v not in bad)))

    node_class = None
    if mode is ProvisioningMode.KARPENTER:
        ref = get_map(provisioner, "karpenterNodeClassRef", "nodeProvisioner.karpenterNodeClassRef", problems)
        fields = {k: get_str(ref, k, f"nodeProvisioner.karpenterNodeClassRef.{k}", problems)
                  for k in ("group", "kind", "version", "name")}
        missing = [k for k, v in fields.items() if not v]
        if missing:
            problems.append("nodeProvisioner.karpenterNodeClassRef: needs group, kind, version and name"
                            f" (missing {', '.join(missing)})")
        else:
            node_class = NodeClassRef(**fields)

    gpu_node_class = ""
    raw_class = provisioner.get("nodeClass")
    if mode is ProvisioningMode.PROVISIONED and raw_class is not None:
        if isinstance(raw_class, str) and raw_class.strip():
            gpu_node_class = raw_class.strip()
        else:
            problems.append(f"nodeProvisioner.nodeClass={shown(raw_class)}: "
                            "expected the name of a GPUNodeClass")

    taints = []
    for i, t in enumerate(get_list(provisioner, "gpuTaints", "nodeProvisioner.gpuTaints", problems)):
        where = f"nodeProvisioner.gpuTaints[{i}]"
        if not isinstance(t, Mapping) or not t.get("key"):
            problems.append(f"{where}={shown(t)}: expected a taint with a key")
            continue
        taints.append({"key": get_str(t, "key", f"{where}.key", problems),
                       "value": get_str(t, "value", f"{where}.value", problems),
                       "effect": get_str(t, "effect", f"{where}.effect", problems, "NoSchedule")})

    period = DEFAULT_COMPACTION_PERIOD
    compaction = get_map(manager, "nodeCompaction", "nodeManagerConfig.nodeCompaction", problems)
    raw_period = compaction.get("period")
    if raw_period not in (None, ""):
        try:
            if not isinstance(raw_period, str):
                raise ValueError(f"{shown(raw_period)} is not a duration like 90s, 5m or 1h30m")
            period = parse_duration(raw_period).total_seconds()
        except ValueError as exc:
            problems.append(f"nodeCompaction.period: {exc}")
    annotations = get_map(meta, "annotations", "metadata.annotations", problems)
    name = meta.get("name")
    uid = meta.get("uid")
    return PoolConfig(
        name=name if isinstance(name, str) else "", mode=mode, min=targets["minResources"],
        warm=targets["warmResources"], max=targets["maxResources"], requirements=tuple(requirements),
        node_class=node_class,
        labels=get_string_map(provisioner, "gpuNodeLabels", "nodeProvisioner.gpuNodeLabels", problems),
        annotations=get_string_map(provisioner, "gpuNodeAnnotations", "nodeProvisioner.gpuNodeAnnotations",
                                   problems),
        taints=tuple(t for t in taints if t["key"]),
        compaction_period=max(period, 1.0), manual_compaction=parse_time(annotations.get(MANUAL_COMPACTION)),
        problems=tuple(problems), uid=uid if isinstance(uid, str) else "", gpu_node_class=gpu_node_class,
    )
