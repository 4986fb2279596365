"""The extender's in-memory picture of the cluster and the verbs computed from it (DESIGN §4, §5).

``ClusterState`` is fed API objects (from watches, or a file in the simulator) and answers filter,
prioritize, bind-time reservation and preemption. It does no I/O and never awaits, so a caller on an
event loop sees every verb as atomic.

Speed: per-node aggregates (devices, load per pool, a version stamp) are updated on each event. Filter
verdicts are cached per request shape and node, and stay valid until that node's version changes, so a
stream of similar pods costs one dictionary lookup per node after the first.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from itertools import compress, filterfalse, repeat
from typing import Any, Protocol

from extender.common.contract import (
    ALLOCATED,
    DOMAIN,
    GPU_IDS,
    POD_INDEX,
    ContractError,
    GPURequest,
    RequestContext,
    decode_index,
    parse_allocated,
    parse_gpu_ids,
    parse_request,
)
from extender.scheduling.columns import GPUColumns
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
    tflops_of,
)
from extender.scheduling.ledger import Allocation, Ledger, RefusalSink
from extender.scheduling.placement import (
    DEFAULT_MODE,
    MAX_SCORE,
    MIN_FIT_SCORE,
    Demand,
    Fit,
    Mode,
    Slot,
    Verdict,
    choose_gpus,
    evaluate,
    mean_load,
    node_order_value,
    parse_mode,
)
from extender.scheduling.preemption import Candidate, choose_victims

UNKNOWN_NODE = "node has no GPUs known to the extender"
TERMINAL_PHASES = ("Succeeded", "Failed")
_REQUEST_CACHE_SIZE = 8192
_MAX_CACHED_KEY = 1024  # longer uids, resourceVersions or request strings are parsed every time
_MAX_ERROR_TEXT = 1024  # a contract error quotes the value: keep the message short
_VERDICT_CACHE_SHAPES = 64
_CHANGE_LOG_SIZE = 100_000
_SCORE_LEVELS = MAX_SCORE - MIN_FIT_SCORE + 1
_LEDGER_POOL = "-"  # the pool does not change what a bound pod holds
_NOT_WAITING_PHASES = frozenset({"Running", *TERMINAL_PHASES})
HOLD_SECONDS = 10.0  # a filter's first choice is held this long for the bind that should follow
_VECTOR_MIN = 64  # this many nodes to judge at once: the columnar check (extender/columns.py) pays off


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


class PdbCheck(Protocol):
    """PodDisruptionBudgets as preemption sees them (extender/pdb.py)."""

    def protected(self, pod_key: str) -> bool: ...
    def violations(self, pod_keys: Sequence[str]) -> int: ...


class PlacementError(Exception):
    """The pod cannot be placed as asked; the message is meant for the user."""


@dataclass(frozen=True)
class Reservation:
    pod_key: str
    pod_uid: str
    node: str
    gpu_ids: tuple[str, ...]
    request: GPURequest


@dataclass(frozen=True)
class FilterOutcome:
    fits: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    error: str | None
    capacity_only: bool


@dataclass(frozen=True)
class Victim:
    uid: str
    namespace: str
    name: str
    priority: int


@dataclass(frozen=True)
class GPUView:
    name: str
    node: str
    pool: str | None
    model: str
    vendor: str
    index: int | None
    phase: str
    capacity_tflops: Fraction
    capacity_vram: int
    used_tflops: Fraction
    used_vram: int
    used_percent: float  # 0.7*VRAM% + 0.3*TFLOPS%
    device: GPUDevice  # the inventory record behind the view


@dataclass(frozen=True)
class UsageFigures:
    tflops_percent: float
    vram_percent: float
    gpus: int
    used_gpus: int
    partially_used_gpus: int


@dataclass(frozen=True)
class Utilisation:
    nodes: dict[str, UsageFigures]
    pools: dict[str, UsageFigures]
    partially_used_gpus: int


@dataclass(frozen=True)
class _Pod:
    uid: str
    key: str
    node: str | None
    phase: str
    index: int | None
    priority: int


@dataclass
class _Table:
    """Verdicts of one request shape for the nodes asked about so far, current as of tick ``synced``."""

    synced: int
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    fit_load: dict[str, float] = field(default_factory=dict)  # fitting nodes: mean load in the pool


_FITS = Verdict(Fit.FITS)


@dataclass(frozen=True)
class _Parsed:
    request: GPURequest
    shape: tuple[object, ...]
    demand: Demand

    @property
    def size(self) -> int:
        """Characters of free text the request holds (what caching it costs beyond a fixed size)."""
        r = self.request
        return len(r.pool) + len(r.gpu_model or "") + len(r.vendor or "") + len(r.workload_profile or "")


def _map(value: Any) -> Mapping[str, Any]:
    """``value`` when it is an object, else an empty one: pods from the scheduler's HTTP body may have any
    shape, and a wrong type must read as "missing", not raise."""
    return value if isinstance(value, dict) else {}


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = _map(pod.get("metadata"))
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str(_map(pod.get("metadata")).get("uid") or pod_key(pod))


def pod_priority(pod: Mapping[str, Any]) -> int:
    priority = _map(pod.get("spec")).get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else 0


def pod_index(pod: Mapping[str, Any]) -> int | None:
    """The ``index`` annotation when written, else the index encoded in the containers' resources."""
    annotations = _map(_map(pod.get("metadata")).get("annotations"))
    raw = str(annotations.get(POD_INDEX, "")).strip()
    if raw.isdigit() and len(raw) < 6:
        return int(raw)
    containers = _map(pod.get("spec")).get("containers")
    for container in containers if isinstance(containers, list) else ():
        resources = _map(_map(container).get("resources"))
        for section in ("limits", "requests"):
            index = decode_index(_map(resources.get(section)))
            if index is not None:
                return index
    return None


def _parse_request(annotations: Mapping[str, Any], default_pool: str | None) -> _Parsed | ContractError:
    try:
        request = parse_request(annotations, RequestContext(default_pool=default_pool))
        return _Parsed(request, _shape(request), Demand.of(request))
    except ContractError as exc:
        # the message alone: neither the traceback (it keeps the pod alive) nor a huge quoted value
        return _contract_error(exc.key, str(exc))
    except (TypeError, ValueError, AttributeError, RecursionError) as exc:
        return _contract_error("metadata.annotations", f"metadata.annotations cannot be read: {exc}")


# Written per pod after admission, never read by parse_request: not part of what identifies a request.
_PER_POD_KEYS = frozenset((GPU_IDS, POD_INDEX, ALLOCATED))
_DOMAIN_PREFIX = DOMAIN + "/"


def _request_text(annotations: Mapping[str, Any], default_pool: str | None) -> tuple[object, ...] | None:
    """What ``parse_request`` reads of these annotations (the tensor-fusion.ai ones, in their order), as a
    cache key; None when a value is not a string or the text is too long to keep."""
    key: list[object] = [default_pool]
    size = 0
    for name, value in annotations.items():
        if type(name) is not str:
            return None
        if name.startswith(_DOMAIN_PREFIX) and name not in _PER_POD_KEYS:
            if type(value) is not str:
                return None
            size += len(name) + len(value)
            key += (name, value)
    return tuple(key) if size <= _MAX_CACHED_KEY else None


def _remember(cache: dict[Any, _Parsed | tuple[str, str]], key: object,
              result: _Parsed | ContractError) -> None:
    """Keep a parse result: a request of sane size as it is, an error as its key and short message (no
    traceback, no pod kept alive). The cache starts over when full."""
    if len(cache) >= _REQUEST_CACHE_SIZE:
        cache.clear()
    if isinstance(result, _Parsed):
        if result.size <= _MAX_CACHED_KEY:
            cache[key] = result
    else:
        cache[key] = (result.key[:_MAX_CACHED_KEY], str(result))


def _contract_error(key: str, message: str) -> ContractError:
    """A ContractError that was never raised (no traceback) with a message of bounded length."""
    error = ContractError(key[:_MAX_CACHED_KEY], "", "")
    error.args = (_short(message),)
    return error


def _short(text: str) -> str:
    return text if len(text) <= _MAX_ERROR_TEXT else text[:_MAX_ERROR_TEXT] + "..."


def _shape(request: GPURequest) -> tuple[object, ...]:
    """The fields that decide where a request fits (not limits, QoS or autoscaling)."""
    return (request.pool, request.tflops_request, request.percent_request, request.vram_request,
            request.gpu_count, request.gpu_model, request.vendor, request.gpu_indices, request.isolation)


class ClusterState:
    def __init__(self, *, inventory: InventorySource = InventorySource.AUTO, max_pods_per_node: int = 256,
                 mode_override: str | None = None, on_refused: RefusalSink | None = None,
                 clock: Callable[[], float] = time.monotonic, hold_seconds: float = HOLD_SECONDS,
                 on_room: Callable[[Iterable[str]], None] | None = None) -> None:
        override = parse_mode(mode_override)
        if mode_override and override is None:
            allowed = ", ".join(m.value for m in Mode)
            raise ValueError(f"unknown placement mode {mode_override!r}; allowed: {allowed}")
        self._source = InventorySource(inventory)
        self._max_pods = max_pods_per_node
        self._override = override
        self._ledger = Ledger(on_refused)
        self._gpu_objects: dict[str, GPUDevice] = {}
        self._gpu_objects_by_node: dict[str, set[str]] = {}
        self._node_labels: dict[str, dict[str, str]] = {}
        self._devices: dict[str, list[GPUDevice]] = {}  # per node, sorted by name
        self._pools: dict[str, tuple[str | None, bool]] = {}  # name -> (template, is default)
        self._templates: dict[str, Mode | None] = {}
        self._default_pool: str | None = None
        self._pods: dict[str, _Pod] = {}
        # uid -> the (gpu-ids, allocated) annotations the ledger's count of a bound pod was read from
        self._counted_from: dict[str, tuple[Any, Any]] = {}
        self._pods_by_node: dict[str, set[str]] = {}
        self._reserved_pods: dict[str, _Pod] = {}
        self._reserved_by_node: dict[str | None, set[str]] = {}  # node -> uids in _reserved_pods
        self._reservations: dict[str, tuple[Reservation, Allocation]] = {}
        self._tick = 0  # one step per node change; self._changes[i] changed at tick base + i + 1
        self._changes: list[str] = []
        self._changes_base = 0
        self._loads: dict[str, dict[str | None, float]] = {}  # read through _load_table()
        self._stale_loads: set[str] = set()
        self._slot_cache: dict[str, tuple[Slot, ...]] = {}  # read through _slots()
        self._requests: dict[tuple[str, str, str | None], _Parsed | tuple[str, str]] = {}
        self._requests_by_text: dict[tuple[object, ...], _Parsed | tuple[str, str]] = {}
        self._tables: OrderedDict[tuple[object, ...], _Table] = OrderedDict()
        self._columns = GPUColumns(self._slots, self._ledger.pods_on)
        # Holds: GPUs of a filter's first choice, kept for the pod's bind (see first_choice).
        self._clock = clock
        self._hold_seconds = hold_seconds
        self._holds: dict[str, Allocation] = {}
        self._hold_queue: deque[tuple[float, Allocation]] = deque()
        self.vector_min = _VECTOR_MIN
        # told the nodes where room may have appeared (GPUs added or changed, an allocation freed)
        self._on_room: Callable[[Iterable[str]], None] = on_room or (lambda nodes: None)

    # --- events -----------------------------------------------------------------------------------

    def apply(self, kind: Kind, event: str, obj: dict[str, Any]) -> None:
        deleted = event == "DELETED"
        if kind is Kind.POD:
            self._apply_pod(obj, deleted)
        elif kind is Kind.GPU:
            self._apply_gpu(obj, deleted)
        elif kind is Kind.NODE:
            self._apply_node(obj, deleted)
        elif kind is Kind.POOL:
            self._apply_pool(obj, deleted)
        elif kind is Kind.TEMPLATE:
            name = object_name(obj)
            if deleted:
                self._templates.pop(name, None)
            else:
                self._templates[name] = parse_mode(template_mode(obj))

    def _apply_pod(self, obj: dict[str, Any], deleted: bool) -> None:
        uid = pod_uid(obj)
        unbound = not (obj.get("spec") or {}).get("nodeName")
        finished = str((obj.get("status") or {}).get("phase") or "") in TERMINAL_PHASES
        if not deleted and unbound and not finished and self._ledger.bound(uid) is not None:
            # A pod never leaves its node: an unbound copy of a pod counted as bound is older news (a watch
            # catching up after a read confirmed the bind), not a change.
            return
        old = self._pods.pop(uid, None)
        if old is not None and old.node is not None:
            self._pods_by_node.get(old.node, set()).discard(uid)
        phase = str((obj.get("status") or {}).get("phase") or "")
        if deleted or phase in TERMINAL_PHASES:
            self._counted_from.pop(uid, None)
            self._freed(self._ledger.forget(uid))
            self._drop_reserved_pod(uid)
            return
        node = (obj.get("spec") or {}).get("nodeName") or None
        record = _Pod(uid, pod_key(obj), node, phase, pod_index(obj), pod_priority(obj))
        self._pods[uid] = record
        if node is not None:
            self._pods_by_node.setdefault(node, set()).add(uid)
        annotations = _map(_map(obj.get("metadata")).get("annotations"))
        record_seen = (annotations.get(GPU_IDS), annotations.get(ALLOCATED))
        if (node and self._counted_from.get(uid) == record_seen
                and (counted := self._ledger.bound(uid)) is not None and counted.node == node):
            return  # the allocation counted is the one these annotations say (a status update, say)
        self._counted_from.pop(uid, None)
        gpu_ids = tuple(dict.fromkeys(parse_gpu_ids(annotations.get(GPU_IDS)))) if node else ()
        held = self._held_request(obj, annotations, len(gpu_ids)) if gpu_ids else None
        if node and held is not None:
            allocation = Allocation(uid, record.key, node, gpu_ids, held, record.priority)
            self._touch(self._ledger.bind(allocation))
            if (counted := self._ledger.bound(uid)) is not None:
                self._drop_reserved_pod(uid)
                if counted.node == node and isinstance(record_seen[1], str):
                    # ``held`` came from these two strings alone: the same pair next time counts the same
                    self._counted_from[uid] = record_seen
        elif node and (counted := self._ledger.bound(uid)) is not None:
            # A bound pod whose allocation record was removed or broken still runs on its GPUs: the record
            # counted at bind time stands until the pod is gone.
            self._ledger.record_lost(counted)
        else:
            self._freed(self._ledger.unbind(uid))

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
        parsed = self._parse(obj, self._default_pool or _LEDGER_POOL)
        return parsed.request if isinstance(parsed, _Parsed) else None

    def _apply_gpu(self, obj: dict[str, Any], deleted: bool) -> None:
        if self._source is InventorySource.NODE_LABELS:
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
        if default != self._default_pool:
            self._default_pool = default
            for node in list(self._node_labels):
                self._refresh_node(node)

    # --- aggregates -------------------------------------------------------------------------------

    def _node_inventory(self, node: str) -> list[GPUDevice]:
        objects = self._gpu_objects_by_node.get(node)
        if objects and self._source is not InventorySource.NODE_LABELS:
            return sorted((self._gpu_objects[n] for n in objects), key=lambda d: d.name)
        labels = self._node_labels.get(node)
        if self._source is InventorySource.GPU_OBJECTS or not labels or not has_gfd_labels(labels):
            return []
        return gpus_from_node_labels(node, labels, self._default_pool)

    def _refresh_node(self, node: str) -> None:
        old = {d.name: d for d in self._devices.get(node, [])}
        new = self._node_inventory(node)
        touched = {node}
        for name in old.keys() - {d.name for d in new}:
            touched |= self._ledger.remove_gpu(name)
        for device in new:
            touched |= self._ledger.set_gpu(device.name, node, device.capacity_tflops, device.capacity_vram)
        if new:
            self._devices[node] = new
        else:
            self._devices.pop(node, None)
        self._touch(touched)
        if any(old.get(device.name) != device for device in new):
            self._on_room((node,))

    def _touch(self, nodes: Iterable[str]) -> None:
        mark = self._columns.mark_node
        for node in nodes:
            self._tick += 1
            self._changes.append(node)
            mark(node)
            self._slot_cache.pop(node, None)
            self._stale_loads.add(node)  # a pod's filter, hold, bind and watch touch its node several times
        if len(self._changes) > _CHANGE_LOG_SIZE:
            self._changes_base += len(self._changes)
            self._changes = []

    def _load_table(self) -> dict[str, dict[str | None, float]]:
        """Each node's mean load per pool, brought up to date for the nodes touched since the last use."""
        stale, loads = self._stale_loads, self._loads
        while stale:
            node = stale.pop()
            by_pool: dict[str | None, list[Slot]] = {}
            for slot in self._slots(node):
                by_pool.setdefault(slot.device.pool, []).append(slot)
            loads[node] = {pool: mean_load(slots) for pool, slots in by_pool.items()}
        return loads

    def _freed(self, nodes: set[str]) -> None:
        self._touch(nodes)
        if nodes:
            self._on_room(nodes)

    def _slots(self, node: str) -> tuple[Slot, ...]:
        """The node's GPUs with their usage, kept until ``_touch`` marks the node changed: a pod's filter,
        hold, bind and watch read its node several times, and every request shape's table judges it."""
        slots = self._slot_cache.get(node)
        if slots is None:
            devices = self._devices.get(node)
            if not devices:
                return ()  # not kept: the names asked about are not bounded, the nodes with GPUs are
            usage = self._ledger.usage
            slots = self._slot_cache[node] = tuple(
                Slot(device, (used := usage(device.name)).tflops, used.vram, used.whole)
                for device in devices)
        return slots

    # --- requests ---------------------------------------------------------------------------------

    def _parse(self, pod: Mapping[str, Any], default_pool: str | None) -> _Parsed | ContractError:
        """The pod's request, or the contract error that rejects it.

        Memory stays bounded whatever pods arrive: the cache holds at most ``_REQUEST_CACHE_SIZE`` entries,
        only for keys of sane length, and an error is cached as its short message (a fresh exception with no
        traceback: a traceback would keep the whole pod alive)."""
        meta = _map(pod.get("metadata"))
        rv = meta.get("resourceVersion")
        key = (pod_uid(pod), str(rv or ""), default_pool)
        cacheable = bool(rv) and len(key[0]) + len(key[1]) <= _MAX_CACHED_KEY
        if cacheable:
            cached = self._requests.get(key)
            if cached is not None:
                return cached if isinstance(cached, _Parsed) else _contract_error(*cached)
        result = self._parse_annotations(_map(meta.get("annotations")), default_pool)
        if cacheable:
            _remember(self._requests, key, result)
        return result

    def _parse_annotations(self, annotations: Mapping[str, Any],
                           default_pool: str | None) -> _Parsed | ContractError:
        """Pods of one workload carry the same request annotations: each distinct set is parsed once (same
        bounds as ``_parse``), and its pods share one ``GPURequest``."""
        key = _request_text(annotations, default_pool)
        if key is None:
            return _parse_request(annotations, default_pool)
        cached = self._requests_by_text.get(key)
        if cached is not None:
            return cached if isinstance(cached, _Parsed) else _contract_error(*cached)
        result = _parse_request(annotations, default_pool)
        _remember(self._requests_by_text, key, result)
        return result

    def request_of(self, pod: Mapping[str, Any]) -> GPURequest:
        """The pod's effective request; raises ``PlacementError`` with the contract's message."""
        parsed = self._parse(pod, self._default_pool)
        if isinstance(parsed, ContractError):
            raise PlacementError(str(parsed))
        return parsed.request

    def mode_for(self, pool: str | None) -> Mode:
        if self._override is not None:
            return self._override
        template, _ = self._pools.get(pool or "", (None, False))
        return self._templates.get(template or "") or DEFAULT_MODE

    @property
    def default_pool(self) -> str | None:
        return self._default_pool

    @property
    def max_pods_per_node(self) -> int:
        return self._max_pods

    def nodes(self) -> list[str]:
        """Every node with at least one GPU known to the extender, by name."""
        return sorted(self._devices)

    # --- filter and prioritize --------------------------------------------------------------------

    def _table(self, parsed: _Parsed) -> _Table:
        """The verdict table of this request shape, brought up to date with the nodes changed since."""
        table = self._tables.get(parsed.shape)
        if table is None:
            table = self._tables[parsed.shape] = _Table(self._tick)
            if len(self._tables) > _VERDICT_CACHE_SHAPES:
                self._tables.popitem(last=False)
            return table
        self._tables.move_to_end(parsed.shape)
        if table.synced == self._tick:
            return table
        if table.synced < self._changes_base:
            changed: Iterable[str] = list(table.verdicts)
        else:
            changed = set(self._changes[table.synced - self._changes_base:])
        for node in changed:
            if node in table.verdicts:
                self._judge(table, node, parsed)
        table.synced = self._tick
        return table

    def _judge(self, table: _Table, node: str, parsed: _Parsed) -> Verdict:
        slots = self._slots(node)
        if not slots:
            verdict = Verdict(Fit.UNRESOLVABLE, UNKNOWN_NODE)
        else:
            pods = self._ledger.pods_on(node)
            verdict = evaluate(slots, parsed.request, pods, self._max_pods, parsed.demand)
        if verdict.fit is Fit.FITS:
            verdict = _FITS
            table.fit_load[node] = self._load_table()[node].get(parsed.request.pool, 0.0)
        else:
            table.fit_load.pop(node, None)
        table.verdicts[node] = verdict
        return verdict

    def _verdicts_for(self, parsed: _Parsed, node_names: Sequence[str]) -> _Table:
        table = self._table(parsed)
        # map/filter keep the per-node work in C: this is the hot path at thousands of nodes.
        missing = list(filterfalse(table.verdicts.__contains__, node_names))
        fits = (self._columns.fitting_nodes(missing, parsed.request, parsed.demand, self._max_pods)
                if len(missing) >= self.vector_min else None)
        if fits is None:
            for name in missing:
                self._judge(table, name, parsed)
            return table
        # A new request shape: the columns find the nodes that fit at once; only the others are judged
        # one by one, for the reason their verdict gives.
        verdicts, fit_load, pool = table.verdicts, table.fit_load, parsed.request.pool
        loads = self._load_table()
        for name, fits_now in zip(missing, fits, strict=True):
            if fits_now:
                verdicts[name] = _FITS
                fit_load[name] = loads[name].get(pool, 0.0)
            else:
                self._judge(table, name, parsed)
        return table

    def _held_node(self, pod: Mapping[str, Any]) -> str | None:
        """The node of the pod's own reservation (its bind is in flight, or done and not yet watched) or
        of its hold (a filter chose that node, the bind has not come yet)."""
        if not self._reservations and not self._holds:
            return None
        uid = pod_uid(pod)
        held = self._reservations.get(uid)
        if held is not None:
            return held[0].node
        hold = self._holds.get(uid)
        return hold.node if hold is not None else None

    def filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome:
        if self._hold_queue:
            self._lapse_holds()
        if (held := self._held_node(pod)) is not None:
            # A scheduler retry of a pod whose bind is under way: only that node, so the retried bind joins
            # the one in flight instead of taking a second share elsewhere.
            message = f"the pod's bind to node {held} is in progress"
            return FilterOutcome([n for n in node_names if n == held],
                                 {n: message for n in node_names if n != held}, {}, None, False)
        parsed = self._parse(pod, self._default_pool)
        if isinstance(parsed, ContractError):
            return FilterOutcome([], {}, {}, str(parsed), False)
        table = self._verdicts_for(parsed, node_names)
        fits = list(filter(table.fit_load.__contains__, node_names))
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if len(fits) < len(node_names):
            for name in filterfalse(table.fit_load.__contains__, node_names):
                verdict = table.verdicts[name]
                (failed if verdict.fit is Fit.FAILED else unresolvable)[name] = verdict.message
        return FilterOutcome(fits, failed, unresolvable, None, not fits and bool(failed))

    def prioritize(self, pod: dict[str, Any], node_names: Sequence[str]) -> list[tuple[str, int]]:
        if (held := self._held_node(pod)) is not None:
            return [(name, MAX_SCORE if name == held else 0) for name in node_names]
        parsed = self._parse(pod, self._default_pool)
        if isinstance(parsed, ContractError):
            return [(name, 0) for name in node_names]
        lowest_first = node_order_value(self.mode_for(parsed.request.pool), 1.0) > 0
        fit_load = self._verdicts_for(parsed, node_names).fit_load
        fitting = list(map(fit_load.__getitem__, filter(fit_load.__contains__, node_names)))
        pick = heapq.nsmallest if lowest_first else heapq.nlargest
        # The first choice (ties by name) alone gets 10; the other fitting nodes get 9 .. 1 by distinct
        # load, so kube-scheduler never picks at random among nodes the mode ranks equal.
        best = pick(_SCORE_LEVELS, set(fitting))
        shift = 1 if best and fitting.count(best[0]) > 1 else 0  # nodes tied with the first choice get 9
        best = best[: _SCORE_LEVELS - shift]
        score_of: dict[float | None, int] = {v: MAX_SCORE - shift - rank for rank, v in enumerate(best)}
        score_of[None] = 0
        scores = list(map(score_of.get, map(fit_load.get, node_names), repeat(MIN_FIT_SCORE)))
        if shift:  # without ties the first choice already scores 10; with them, the first by name does
            first = min(compress(node_names, map((MAX_SCORE - 1).__eq__, scores)))
            scores[node_names.index(first)] = MAX_SCORE
        return list(zip(node_names, scores, strict=False))

    def first_choice(self, pod: dict[str, Any], outcome: FilterOutcome, *,
                     hold: bool = True) -> FilterOutcome:
        """``outcome`` with the fitting nodes narrowed to the one prioritize would score 10 (the mode's
        order, ties by name). With a single feasible node kube-scheduler skips scoring, so the pod costs
        one extender call instead of two; the shipped weight makes that node the scheduler's choice anyway.
        Being the scheduler's choice, its GPUs are held for the bind that follows (``hold``)."""
        fits = outcome.fits
        parsed = self._parse(pod, self._default_pool)
        if not fits or isinstance(parsed, ContractError):
            return outcome
        if len(fits) > 1:
            fit_load = self._verdicts_for(parsed, fits).fit_load
            loads = list(map(fit_load.__getitem__, fits))
            lowest_first = node_order_value(self.mode_for(parsed.request.pool), 1.0) > 0
            best = min(loads) if lowest_first else max(loads)
            outcome = FilterOutcome([min(compress(fits, map(best.__eq__, loads)))], outcome.failed,
                                    outcome.unresolvable, outcome.error, outcome.capacity_only)
        if hold:
            self._hold(pod, parsed, outcome.fits[0])
        return outcome

    def rank(self, pod: dict[str, Any], node_names: Sequence[str]) -> list[str]:
        """The fitting nodes in the mode's order (ties by name): the order prioritize scores."""
        parsed = self._parse(pod, self._default_pool)
        if isinstance(parsed, ContractError):
            return []
        sign = node_order_value(self.mode_for(parsed.request.pool), 1.0)
        fit_load = self._verdicts_for(parsed, node_names).fit_load
        return sorted({n for n in node_names if n in fit_load}, key=lambda n: (sign * fit_load[n], n))

    # --- bind -------------------------------------------------------------------------------------

    def reserve(self, pod: dict[str, Any], node: str) -> Reservation:
        request = self.request_of(pod)
        uid, key = pod_uid(pod), pod_key(pod)
        bound = self._ledger.bound(uid)
        if bound is not None:
            raise PlacementError(f"pod {key} already holds GPUs {','.join(bound.gpu_ids)} on {bound.node}")
        self._take_hold(uid)  # the filter's hold for this bind: re-chosen below, with the same room free
        # A retry replaces the pod's earlier reservation, which is restored if the new one fails.
        previous = self._reservations.pop(uid, None)
        if previous is not None:
            self._touch(self._ledger.release(previous[1]))
        verdict = evaluate(self._slots(node), request, self._ledger.pods_on(node), self._max_pods)
        if verdict.fit is not Fit.FITS:
            if previous is not None:
                self._reservations[uid] = previous
                self._touch(self._ledger.reserve(previous[1]))
            raise PlacementError(f"node {node}: {verdict.message}")
        gpu_ids = choose_gpus(verdict.fitting, request, self.mode_for(request.pool))
        priority = pod_priority(pod)
        allocation = Allocation(uid, key, node, gpu_ids, request, priority)
        reservation = Reservation(key, uid, node, gpu_ids, request)
        self._reservations[uid] = (reservation, allocation)
        self._add_reserved_pod(_Pod(uid, key, node, "", pod_index(pod), priority))
        self._touch(self._ledger.reserve(allocation))
        return reservation

    def reservation(self, uid: str) -> Reservation | None:
        """The reservation of a bind that has not been seen in the watched pod yet, if any."""
        held = self._reservations.get(uid)
        return held[0] if held is not None else None

    def confirm(self, pod: dict[str, Any]) -> None:
        """A pod read from the API server shows it bound with its GPUs: count that allocation now
        instead of when the watch delivers it (the watch later brings the same or a newer state)."""
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName") and annotations.get(GPU_IDS):
            self._apply_pod(pod, False)

    def release(self, reservation: Reservation) -> None:
        held = self._reservations.get(reservation.pod_uid)
        if held is None or held[0] != reservation:
            return
        del self._reservations[reservation.pod_uid]
        self._pop_reserved_pod(reservation.pod_uid)
        self._freed(self._ledger.release(held[1]))

    def _drop_reserved_pod(self, uid: str) -> None:
        self._reservations.pop(uid, None)
        self._pop_reserved_pod(uid)
        self._holds.pop(uid, None)

    def _add_reserved_pod(self, pod: _Pod) -> None:
        self._pop_reserved_pod(pod.uid)  # a retry may reserve on another node
        self._reserved_pods[pod.uid] = pod
        self._reserved_by_node.setdefault(pod.node, set()).add(pod.uid)

    def _pop_reserved_pod(self, uid: str) -> None:
        pod = self._reserved_pods.pop(uid, None)
        if pod is not None:
            on_node = self._reserved_by_node[pod.node]
            on_node.discard(uid)
            if not on_node:
                del self._reserved_by_node[pod.node]

    # --- holds ------------------------------------------------------------------------------------

    def _hold(self, pod: dict[str, Any], parsed: _Parsed, node: str) -> None:
        """Hold the GPUs the bind of ``pod`` on ``node`` would take, so that the filters of the pods
        scheduled before that bind arrives do not count the same room free (kube-scheduler pipelines:
        it filters the next pods while earlier binds are still on their way). The bind takes the hold
        over; an unused hold lapses after ``hold_seconds``."""
        uid = pod_uid(pod)
        if uid in self._reservations or self._ledger.bound(uid) is not None:
            return
        previous = self._holds.pop(uid, None)
        if previous is not None:
            self._touch(self._ledger.release(previous))
        verdict = evaluate(self._slots(node), parsed.request, self._ledger.pods_on(node), self._max_pods,
                           parsed.demand)
        if verdict.fit is not Fit.FITS:
            return
        gpu_ids = choose_gpus(verdict.fitting, parsed.request, self.mode_for(parsed.request.pool))
        allocation = Allocation(uid, pod_key(pod), node, gpu_ids, parsed.request, pod_priority(pod))
        self._holds[uid] = allocation
        self._hold_queue.append((self._clock() + self._hold_seconds, allocation))
        self._touch(self._ledger.reserve(allocation))

    def _take_hold(self, uid: str) -> None:
        allocation = self._holds.pop(uid, None)
        if allocation is not None:
            self._touch(self._ledger.release(allocation))

    def _lapse_holds(self) -> None:
        now, queue = self._clock(), self._hold_queue
        while queue and queue[0][0] <= now:
            _, allocation = queue.popleft()
            if self._holds.get(allocation.uid) is allocation:
                del self._holds[allocation.uid]
                self._freed(self._ledger.release(allocation))

    def pending_index_holder(self, node: str, index: int, pod_uid: str) -> str | None:
        def waits_with_index(pod: _Pod) -> bool:
            return pod.uid != pod_uid and pod.index == index and pod.phase not in _NOT_WAITING_PHASES

        on_node = self._pods_by_node.get(node, set())
        reserved = self._reserved_by_node.get(node, set()) - on_node
        pods = [*map(self._pods.__getitem__, on_node), *map(self._reserved_pods.__getitem__, reserved)]
        holders = [pod.key for pod in pods if waits_with_index(pod)]
        return min(holders) if holders else None  # the first by name, whatever the order of the sets

    # --- preemption -------------------------------------------------------------------------------

    def _victims(self, node: str, request: GPURequest, priority: int, uid: str,
                 pdb: PdbCheck | None = None) -> list[Victim] | None:
        slots = self._slots(node)
        pods = self._ledger.pods_on(node)
        if not slots or evaluate(slots, request, pods, self._max_pods).fit is Fit.UNRESOLVABLE:
            return None
        candidates = [
            Candidate(a, {gpu: self._ledger.share(a, gpu) for gpu in a.gpu_ids})
            for a in self._ledger.allocations_on(node)
            if a.priority < priority and a.uid != uid and self._ledger.bound(a.uid) is a
        ]
        protected = (lambda c: pdb.protected(c.allocation.pod_key)) if pdb is not None else None
        chosen = choose_victims(slots, request, pods, self._max_pods, candidates, protected)
        if chosen is None:
            return None
        out = []
        for victim in chosen:
            namespace, _, name = victim.allocation.pod_key.partition("/")
            out.append(Victim(victim.allocation.uid, namespace, name, victim.priority))
        return out

    def preempt(self, pod: dict[str, Any], nodes: Sequence[str],
                pdb: PdbCheck | None = None) -> dict[str, list[Victim]]:
        """Per node, the victims whose release lets the pod fit; with ``pdb``, pods a PodDisruptionBudget
        protects are chosen only when no other set will do."""
        parsed = self._parse(pod, self._default_pool)
        if isinstance(parsed, ContractError):
            return {}
        out: dict[str, list[Victim]] = {}
        for node in nodes:
            victims = self._victims(node, parsed.request, pod_priority(pod), pod_uid(pod), pdb)
            if victims is not None:
                out[node] = victims
        return out

    def holds(self, uid: str) -> bool:
        """Whether the pod still holds GPU capacity (bound, reserved, or terminating but not gone)."""
        return self._ledger.allocation(uid) is not None

    def find_preemption(self, pod: dict[str, Any],
                        pdb: PdbCheck | None = None) -> tuple[str, list[Victim]] | None:
        """The node and victims to preempt for: the fewest PodDisruptionBudget violations, then the fewest
        victims, then the lowest highest priority among them, then the node name."""
        parsed = self._parse(pod, self._default_pool)
        if isinstance(parsed, ContractError):
            return None
        pool = parsed.request.pool
        loads = self._load_table()
        nodes = [n for n in self.nodes() if pool in loads.get(n, {})]
        options = self.preempt(pod, nodes, pdb)
        if not options:
            return None

        def broken(victims: list[Victim]) -> int:
            return pdb.violations([f"{v.namespace}/{v.name}" for v in victims]) if pdb is not None else 0

        best = min(options.items(), key=lambda item: (
            broken(item[1]), len(item[1]), max((v.priority for v in item[1]), default=-(2**63)), item[0]))
        return best[0], best[1]

    # --- views ------------------------------------------------------------------------------------

    def node_gpus(self, node: str) -> list[GPUView]:
        return [
            GPUView(
                name=s.device.name, node=node, pool=s.device.pool, model=s.device.model,
                vendor=s.device.vendor, index=s.device.index, phase=s.device.phase,
                capacity_tflops=tflops_of(s.device.capacity_tflops), capacity_vram=s.device.capacity_vram,
                used_tflops=tflops_of(s.used_tflops), used_vram=s.used_vram, used_percent=s.used,
                device=s.device,
            )
            for s in self._slots(node)
        ]

    def gpu_holders(self, gpu: str) -> list[Allocation]:
        """The allocations holding a share of one GPU, by pod uid."""
        return self._ledger.holders(gpu)

    def changed_since(self, tick: int) -> tuple[set[str] | None, int]:
        """The nodes whose GPUs or allocations changed after ``tick`` (None: too long ago to tell, so
        treat every node as changed), and the current tick to ask from next time."""
        if tick == self._tick:
            return set(), tick
        if tick < self._changes_base:
            return None, self._tick
        return set(self._changes[tick - self._changes_base:]), self._tick

    def pool_occupancy(self, pool: str) -> dict[str, tuple[int, int, float]]:
        """Per node with GPUs of ``pool``: how many it has, how many hold an allocation, their mean load."""
        out = {}
        for node in self._devices:
            slots = [s for s in self._slots(node) if s.device.pool == pool]
            if slots:
                out[node] = (len(slots), sum(1 for s in slots if not s.idle), mean_load(slots))
        return out

    def allocations(self) -> list[Allocation]:
        """Every allocation that counts (bound pods, then reservations of binds in flight)."""
        return self._ledger.allocations()

    @property
    def version(self) -> int:
        """Moves whenever a node's allocations or GPUs change (to notice changes without diffing)."""
        return self._tick

    def held_gpus(self) -> dict[str, str]:
        """GPU name -> node, for every GPU that a bound pod (not a bind in flight) holds a share of."""
        return {gpu: a.node for a in self._ledger.allocations() if self._ledger.bound(a.uid) is a
                for gpu in a.gpu_ids}

    def gpu_usage(self) -> dict[str, tuple[Fraction, int]]:
        """Allocated TFLOPS and VRAM per known GPU."""
        return {
            s.device.name: (tflops_of(s.used_tflops), s.used_vram)
            for node in self._devices for s in self._slots(node)
        }

    def utilisation(self) -> Utilisation:
        nodes: dict[str, list[Slot]] = {}
        pools: dict[str, list[Slot]] = {}
        for node in sorted(self._devices):
            for slot in self._slots(node):
                nodes.setdefault(node, []).append(slot)
                if slot.device.pool:
                    pools.setdefault(slot.device.pool, []).append(slot)
        node_figures = {name: _figures(slots) for name, slots in nodes.items()}
        return Utilisation(
            nodes=node_figures,
            pools={name: _figures(slots) for name, slots in sorted(pools.items())},
            partially_used_gpus=sum(f.partially_used_gpus for f in node_figures.values()),
        )


def _figures(slots: Sequence[Slot]) -> UsageFigures:
    cap_t = sum(s.device.capacity_tflops for s in slots)
    cap_v = sum(s.device.capacity_vram for s in slots)
    used_t = sum(s.used_tflops for s in slots)
    used_v = sum(s.used_vram for s in slots)
    return UsageFigures(
        tflops_percent=100.0 * used_t / cap_t if cap_t else 0.0,
        vram_percent=100.0 * used_v / cap_v if cap_v else 0.0,
        gpus=len(slots),
        used_gpus=sum(1 for s in slots if not s.idle),
        partially_used_gpus=sum(1 for s in slots if not s.idle and 0.0 < s.used < 100.0),
    )
