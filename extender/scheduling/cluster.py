"""The picture: what the extender knows of the cluster's GPUs and of the pods holding them (DESIGN §4).

``Cluster`` is fed API objects one event at a time (``apply``), keeps per-node aggregates (devices, load
per pool) and a change log (which node changed at which tick), and owns the allocation ledger and the
columnar copy of free capacity. It decides nothing about placement and does no I/O.

What an event means for a pod's assumed GPUs (its bind's reservation, its filter's hold) is not the
picture's business: ``apply`` reports it (``PodChange``) and the caller forgets what it assumed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Any

from extender.common.contract import (
    ALLOCATED,
    GPU_IDS,
    ContractError,
    GPURequest,
    parse_allocated,
    parse_gpu_ids,
)
from extender.common.pods import TERMINAL_PHASES, as_map, pod_index, pod_key, pod_priority, pod_uid
from extender.scheduling.columns import GPUColumns
from extender.scheduling.instance_topology import BUILT_IN as BUILT_IN_SHAPES
from extender.scheduling.instance_topology import Shape
from extender.scheduling.inventory import (
    GPUDevice,
    gpu_from_object,
    gpus_from_node_labels,
    has_gfd_labels,
    node_labels,
    object_name,
    pool_is_default,
    pool_template,
    template_mode,
    template_topology,
)
from extender.scheduling.ledger import Allocation, Ledger, RefusalSink
from extender.scheduling.placement import DEFAULT_MODE, Mode, Slot, mean_load, parse_mode
from extender.scheduling.requests import Parsed, RequestCache
from extender.scheduling.topology import DEFAULT_SETTINGS, Settings, SettingsError, parse_settings

CHANGE_LOG_SIZE = 100_000
_LEDGER_POOL = "-"  # the pool does not change what a bound pod holds

RoomSink = Callable[[Iterable[str]], None]


def _no_room(nodes: Iterable[str]) -> None:
    return None


class Kind(StrEnum):
    NODE = "Node"
    GPU = "GPU"
    POD = "Pod"
    POOL = "GPUPool"
    TEMPLATE = "SchedulingConfigTemplate"


class InventorySource(StrEnum):
    GPU_OBJECTS = "gpu-objects"
    NODE_LABELS = "node-labels"
    AUTO = "auto"  # GPU objects for nodes that have them, GFD labels otherwise


class PodChange(Enum):
    """What an event did to a pod, as far as the GPUs assumed for it go."""

    UNCHANGED = "unchanged"  # not a pod, or nothing that settles its bind: what is assumed for it stands
    BOUND = "bound"  # its allocation now counts as bound: its reservation and hold are spent
    GONE = "gone"  # deleted or finished: it holds nothing, assumed or bound


@dataclass(frozen=True)
class PodRecord:
    uid: str
    key: str
    node: str | None
    phase: str
    index: int | None
    priority: int


class Cluster:
    def __init__(self, requests: RequestCache, *, inventory: InventorySource = InventorySource.AUTO,
                 max_pods_per_node: int = 256, mode_override: Mode | None = None,
                 on_refused: RefusalSink | None = None, on_room: RoomSink | None = None) -> None:
        self.requests = requests
        self.source = InventorySource(inventory)
        self.max_pods = max_pods_per_node
        self.override = mode_override
        self.ledger = Ledger(on_refused)
        # told the nodes where room may have appeared (GPUs added or changed, an allocation freed)
        self.on_room: RoomSink = on_room or _no_room
        self.default_pool: str | None = None
        self.pods: dict[str, PodRecord] = {}
        self.pods_by_node: dict[str, set[str]] = {}
        self.devices: dict[str, list[GPUDevice]] = {}  # per node, sorted by name
        self._gpu_objects: dict[str, GPUDevice] = {}
        self._gpu_objects_by_node: dict[str, set[str]] = {}
        self._node_labels: dict[str, dict[str, str]] = {}
        self._pools: dict[str, tuple[str | None, bool]] = {}  # name -> (template, is default)
        self._templates: dict[str, Mode | None] = {}
        # template -> its topology setting; an unreadable one keeps TensorFusion's defaults (and says why)
        self._topology: dict[str, Settings] = {}
        self.topology_errors: dict[str, str] = {}
        self.shapes: dict[str, Shape] = dict(BUILT_IN_SHAPES)  # instance type -> GPU topology
        # uid -> the (gpu-ids, allocated) annotations the ledger's count of a bound pod was read from
        self._counted_from: dict[str, tuple[Any, Any]] = {}
        self.tick = 0  # one step per node change; self._changes[i] changed at tick base + i + 1
        self._changes: list[str] = []
        self._changes_base = 0
        self._loads: dict[str, dict[str | None, float]] = {}  # read through load_table()
        self._stale_loads: set[str] = set()
        self._slot_cache: dict[str, tuple[Slot, ...]] = {}  # read through slots()
        self.columns = GPUColumns(self.slots, self.ledger.pods_on)

    # --- a what-if copy -----------------------------------------------------------------------------

    def quiet_copy(self) -> Cluster:
        """An independent copy that tells no one anything: no room callback, no refusal reports. Its
        change log starts at the current tick (anything older reads as "too long ago to tell")."""
        sim = copy.copy(self)
        sim.requests = RequestCache()
        sim.ledger = self.ledger.copy()
        sim.on_room = _no_room
        sim.pods = dict(self.pods)
        sim.pods_by_node = {node: set(uids) for node, uids in self.pods_by_node.items()}
        sim.devices = dict(self.devices)  # lists are replaced, never changed in place
        sim._gpu_objects = dict(self._gpu_objects)
        sim._gpu_objects_by_node = {node: set(names) for node, names in self._gpu_objects_by_node.items()}
        sim._node_labels = dict(self._node_labels)  # label maps are replaced, never changed in place
        sim._pools = dict(self._pools)
        sim._templates = dict(self._templates)
        sim._topology = dict(self._topology)
        sim.topology_errors = dict(self.topology_errors)
        sim.shapes = dict(self.shapes)
        sim._counted_from = dict(self._counted_from)
        sim._changes = []
        sim._changes_base = self.tick
        sim._loads = dict(self._loads)  # per-node maps are replaced, never changed in place
        sim._stale_loads = set(self._stale_loads)
        sim._slot_cache = dict(self._slot_cache)
        sim.columns = self.columns.copy(sim.slots, sim.ledger.pods_on)
        return sim

    # --- events -----------------------------------------------------------------------------------

    def apply(self, kind: Kind, event: str, obj: dict[str, Any]) -> PodChange:
        deleted = event == "DELETED"
        if kind is Kind.POD:
            return self._apply_pod(obj, deleted)
        if kind is Kind.GPU:
            self._apply_gpu(obj, deleted)
        elif kind is Kind.NODE:
            self._apply_node(obj, deleted)
        elif kind is Kind.POOL:
            self._apply_pool(obj, deleted)
        elif kind is Kind.TEMPLATE:
            name = object_name(obj)
            self._topology.pop(name, None)
            self.topology_errors.pop(name, None)
            if deleted:
                self._templates.pop(name, None)
            else:
                self._templates[name] = parse_mode(template_mode(obj))
                try:
                    self._topology[name] = parse_settings(template_topology(obj))
                except SettingsError as exc:
                    self.topology_errors[name] = f"SchedulingConfigTemplate {name}: {exc}"
        return PodChange.UNCHANGED

    def _apply_pod(self, obj: dict[str, Any], deleted: bool) -> PodChange:
        uid = pod_uid(obj)
        ledger = self.ledger
        unbound = not (obj.get("spec") or {}).get("nodeName")
        finished = str((obj.get("status") or {}).get("phase") or "") in TERMINAL_PHASES
        if not deleted and unbound and not finished and ledger.bound(uid) is not None:
            # A pod never leaves its node: an unbound copy of a pod counted as bound is older news (a watch
            # catching up after a read confirmed the bind), not a change.
            return PodChange.UNCHANGED
        old = self.pods.pop(uid, None)
        if old is not None and old.node is not None:
            self.pods_by_node.get(old.node, set()).discard(uid)
        phase = str((obj.get("status") or {}).get("phase") or "")
        if deleted or phase in TERMINAL_PHASES:
            self._counted_from.pop(uid, None)
            self.freed(ledger.forget(uid))
            return PodChange.GONE
        node = (obj.get("spec") or {}).get("nodeName") or None
        record = PodRecord(uid, pod_key(obj), node, phase, pod_index(obj), pod_priority(obj))
        self.pods[uid] = record
        if node is not None:
            self.pods_by_node.setdefault(node, set()).add(uid)
        annotations = as_map(as_map(obj.get("metadata")).get("annotations"))
        record_seen = (annotations.get(GPU_IDS), annotations.get(ALLOCATED))
        if (node and self._counted_from.get(uid) == record_seen
                and (counted := ledger.bound(uid)) is not None and counted.node == node):
            return PodChange.UNCHANGED  # the allocation counted is the one these annotations say
        self._counted_from.pop(uid, None)
        gpu_ids = tuple(dict.fromkeys(parse_gpu_ids(annotations.get(GPU_IDS)))) if node else ()
        held = self._held_request(obj, annotations, len(gpu_ids)) if gpu_ids else None
        if node and held is not None:
            allocation = Allocation(uid, record.key, node, gpu_ids, held, record.priority)
            self.touch(ledger.bind(allocation))
            if (counted := ledger.bound(uid)) is None:
                return PodChange.UNCHANGED  # refused: a reservation of its bind in flight still counts
            if counted.node == node and isinstance(record_seen[1], str):
                # ``held`` came from these two strings alone: the same pair next time counts the same
                self._counted_from[uid] = record_seen
            return PodChange.BOUND
        if node and (counted := ledger.bound(uid)) is not None:
            # A bound pod whose allocation record was removed or broken still runs on its GPUs: the record
            # counted at bind time stands until the pod is gone.
            ledger.record_lost(counted)
        else:
            self.freed(ledger.unbind(uid))
        return PodChange.UNCHANGED

    def _held_request(self, obj: dict[str, Any], annotations: Mapping[str, Any],
                      gpus: int) -> GPURequest | None:
        """What a bound pod holds per GPU: the amounts its bind recorded (``allocated``); for pods bound
        before that record existed, its request annotations."""
        record = annotations.get(ALLOCATED)
        if isinstance(record, str):
            try:
                return parse_allocated(record, gpus)
            except ContractError:
                return None
        parsed = self.requests.parse(obj, self.default_pool or _LEDGER_POOL)
        return parsed.request if isinstance(parsed, Parsed) else None

    def _apply_gpu(self, obj: dict[str, Any], deleted: bool) -> None:
        if self.source is InventorySource.NODE_LABELS:
            return
        name = object_name(obj)
        old = self._gpu_objects.pop(name, None)
        if old is not None:
            self._gpu_objects_by_node.get(old.node, set()).discard(name)
        device = None if deleted else gpu_from_object(obj)
        if device is not None:
            self._gpu_objects[name] = device
            self._gpu_objects_by_node.setdefault(device.node, set()).add(name)
            self._refresh_node(device.node)
        if old is not None and (device is None or device.node != old.node):
            self._refresh_node(old.node)

    def _apply_node(self, obj: dict[str, Any], deleted: bool) -> None:
        name = object_name(obj)
        labels = {} if deleted else node_labels(obj)
        if self._node_labels.get(name, {}) == labels:
            return
        if labels:
            self._node_labels[name] = labels
        else:
            self._node_labels.pop(name, None)
        self._refresh_node(name)

    def _apply_pool(self, obj: dict[str, Any], deleted: bool) -> None:
        name = object_name(obj)
        if deleted:
            self._pools.pop(name, None)
        else:
            self._pools[name] = (pool_template(obj), pool_is_default(obj))
        defaults = sorted(n for n, (_, is_default) in self._pools.items() if is_default)
        default = defaults[0] if defaults else None
        if default != self.default_pool:
            self.default_pool = default
            for node in list(self._node_labels):
                self._refresh_node(node)

    # --- aggregates -------------------------------------------------------------------------------

    def _node_inventory(self, node: str) -> list[GPUDevice]:
        objects = self._gpu_objects_by_node.get(node)
        if objects and self.source is not InventorySource.NODE_LABELS:
            return sorted((self._gpu_objects[n] for n in objects), key=lambda d: d.name)
        labels = self._node_labels.get(node)
        if self.source is InventorySource.GPU_OBJECTS or not labels or not has_gfd_labels(labels):
            return []
        return gpus_from_node_labels(node, labels, self.default_pool, self.shapes)

    def set_shapes(self, shapes: Mapping[str, Shape]) -> None:
        """The instance-type topology table (built-in entries plus a ConfigMap's) changed: re-read the nodes
        whose GPUs come from feature-discovery labels."""
        if shapes == self.shapes:
            return
        self.shapes = dict(shapes)
        for node in list(self._node_labels):
            self._refresh_node(node)

    def _refresh_node(self, node: str) -> None:
        old = {d.name: d for d in self.devices.get(node, [])}
        new = self._node_inventory(node)
        touched = {node}
        for name in old.keys() - {d.name for d in new}:
            touched |= self.ledger.remove_gpu(name)
        for device in new:
            touched |= self.ledger.set_gpu(device.name, node, device.capacity_tflops, device.capacity_vram)
        if new:
            self.devices[node] = new
        else:
            self.devices.pop(node, None)
        self.touch(touched)
        if any(old.get(device.name) != device for device in new):
            self.on_room((node,))

    def touch(self, nodes: Iterable[str]) -> None:
        """These nodes' GPUs or allocations changed: log it and drop what was derived from them."""
        mark = self.columns.mark_node
        for node in nodes:
            self.tick += 1
            self._changes.append(node)
            mark(node)
            self._slot_cache.pop(node, None)
            self._stale_loads.add(node)  # a pod's filter, hold, bind and watch touch its node several times
        if len(self._changes) > CHANGE_LOG_SIZE:
            self._changes_base += len(self._changes)
            self._changes = []

    def freed(self, nodes: set[str]) -> None:
        """Allocations on these nodes were released: ``touch`` them and tell of the room."""
        self.touch(nodes)
        if nodes:
            self.on_room(nodes)

    def changed_since(self, tick: int) -> tuple[set[str] | None, int]:
        """The nodes whose GPUs or allocations changed after ``tick`` (None: too long ago to tell, so
        treat every node as changed), and the current tick to ask from next time."""
        if tick == self.tick:
            return set(), tick
        if tick < self._changes_base:
            return None, self.tick
        return set(self._changes[tick - self._changes_base:]), self.tick

    def load_table(self) -> dict[str, dict[str | None, float]]:
        """Each node's mean load per pool, brought up to date for the nodes touched since the last use."""
        stale, loads = self._stale_loads, self._loads
        while stale:
            node = stale.pop()
            by_pool: dict[str | None, list[Slot]] = {}
            for slot in self.slots(node):
                by_pool.setdefault(slot.device.pool, []).append(slot)
            loads[node] = {pool: mean_load(slots) for pool, slots in by_pool.items()}
        return loads

    def slots(self, node: str) -> tuple[Slot, ...]:
        """The node's GPUs with their usage, kept until ``touch`` marks the node changed: a pod's filter,
        hold, bind and watch read its node several times, and every request shape's table judges it."""
        slots = self._slot_cache.get(node)
        if slots is None:
            devices = self.devices.get(node)
            if not devices:
                return ()  # not kept: the names asked about are not bounded, the nodes with GPUs are
            usage, holders = self.ledger.usage, self.ledger.holder_count
            slots = self._slot_cache[node] = tuple(
                Slot(device, (used := usage(device.name)).tflops, used.vram, used.whole, holders(device.name))
                for device in devices)
        return slots

    def mode_for(self, pool: str | None) -> Mode:
        if self.override is not None:
            return self.override
        template, _ = self._pools.get(pool or "", (None, False))
        return self._templates.get(template or "") or DEFAULT_MODE

    def topology_for(self, pool: str | None) -> Settings:
        """The pool's GPU topology setting (its SchedulingConfigTemplate's ``placement.gpuTopology``)."""
        template, _ = self._pools.get(pool or "", (None, False))
        return self._topology.get(template or "") or DEFAULT_SETTINGS

    def nodes(self) -> list[str]:
        """Every node with at least one GPU known to the extender, by name."""
        return sorted(self.devices)
