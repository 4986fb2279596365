"""A bounded cache of mutation results, so that pods of one workload skip re-parsing and re-rendering.

The pods a ReplicaSet or Job creates reach the webhook as identical objects (their names are generated
after admission), so the mutation of the second and later ones is known. The cache key is everything the
mutation reads:

- the pod itself, as its JSON text (exact: any difference at all is another key; orjson's text for a pod
  that orjson decoded, the standard library's otherwise, as orjson writes NaN as null);
- the namespace, the scheduler name and the Karpenter do-not-disrupt switch;
- the workload name the owner chain gives (owners come from the owner cache, per request);
- a generation the caller bumps whenever a GPUPool, WorkloadProfile or SchedulingConfigTemplate changes.

The only per-pod part of a mutation is the pod index. Only the GPU containers' resources depend on it, and
the patch diff visits ``spec.containers`` once, so their operations are one contiguous run of the patch: an
entry keeps the operations before and after that run, and each admission recomputes just the GPU
containers' operations with its own index. The patch is therefore identical, operation for operation, to
what ``mutate`` returns (tests/unit/webhook/test_memo.py checks it).

Not thread-safe: the server uses it from its event loop only.
"""

from __future__ import annotations

import base64
import json
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import orjson

from extender.common.contract import GPURequest
from webhook.mutation import EVERYWHERE, Denial, is_opted_in, mutate, set_index
from webhook.patch import PatchOp, diff
from webhook.priority import PriorityPolicy
from webhook.view import ClusterView, KubeObject
from webhook.workload import workload_name

DEFAULT_MAX_ENTRIES = 512
# Pods longer than this (JSON text, characters or bytes) are mutated without the cache, which bounds its
# memory (entries x size).
DEFAULT_MAX_POD_BYTES = 32 * 1024
_CONTAINERS = "/spec/containers/"
# the key's text: no ASCII escaping and no cycle check (a pod decoded from JSON has no cycles), the cheapest
_KEY_ENCODER = json.JSONEncoder(ensure_ascii=False, check_circular=False)


@dataclass(frozen=True)
class Mutation:
    """What admission needs of a mutation: the patch, or a denial, or that the pod was skipped."""

    patch: list[PatchOp]
    denial: Denial | None = None
    skipped: bool = False
    request: GPURequest | None = None
    encoded: str | None = None  # the patch as the AdmissionReview response carries it, when known


def encode_patch(patch: list[PatchOp]) -> str:
    """The base64 of the JSON Patch (compact JSON), as ``response.patch`` of an AdmissionReview."""
    return base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()


@dataclass(frozen=True)
class _Entry:
    head: tuple[PatchOp, ...]  # operations before the GPU containers' ones (all of them if none)
    tail: tuple[PatchOp, ...]
    gpu_positions: tuple[int, ...]  # empty: the patch does not depend on the index
    mutation: Mutation
    # the finished mutation per pod index (at most 128), its patch encoded once
    by_index: dict[int, Mutation] = field(default_factory=dict)


class MutationCache:
    """``mutate`` through a bounded LRU cache; ``hits`` and ``misses`` count lookups."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_pod_bytes: int = DEFAULT_MAX_POD_BYTES) -> None:
        self.max_entries = max_entries
        self.max_pod_bytes = max_pod_bytes
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def mutate(self, pod: KubeObject, view: ClusterView, *, scheduler_name: str, index: int,
               namespace: str | None = None, do_not_disrupt: bool = False,
               generation: Hashable = 0, plain_json: bool = False,
               priority: PriorityPolicy = EVERYWHERE) -> Mutation:
        """The same patch (or denial) ``webhook.mutation.mutate`` gives for these arguments, provided
        ``generation`` changed whenever the view's pools, profiles or templates did. ``plain_json``: the pod
        was decoded by orjson (``webhook.admission.Request.plain_json``), so orjson's text of it is exact."""
        key = self._key(pod, view, scheduler_name, namespace, do_not_disrupt, (generation, priority),
                        plain_json)
        entry = self._entries.get(key) if key is not None else None
        if entry is None:
            self.misses += 1
            result = mutate(pod, view, scheduler_name=scheduler_name, index=index, namespace=namespace,
                            do_not_disrupt=do_not_disrupt, priority=priority)
            mutation = Mutation(result.patch, result.denial, result.skipped, result.request)
            if key is not None:
                mutation = Mutation(result.patch, result.denial, result.skipped, result.request,
                                    encode_patch(result.patch) if result.patch else None)
                entry = _entry(result.patch, result.gpu_positions, mutation)
                entry.by_index[index] = mutation
                self._store(key, entry)
            return mutation
        self.hits += 1
        self._entries.move_to_end(key)
        if not entry.gpu_positions:
            return entry.mutation
        known = entry.by_index.get(index)
        if known is None:
            patch = [*entry.head, *_index_ops(pod, entry.gpu_positions, index), *entry.tail]
            known = entry.by_index[index] = Mutation(patch, request=entry.mutation.request,
                                                     encoded=encode_patch(patch))
        return known

    def _key(self, pod: KubeObject, view: ClusterView, scheduler_name: str, namespace: str | None,
             do_not_disrupt: bool, generation: Hashable, plain_json: bool) -> Hashable | None:
        if not is_opted_in(pod) or not isinstance(pod.get("metadata"), dict):
            return None  # skipped or denied at once: nothing to save
        text = _text(pod, plain_json)
        if len(text) > self.max_pod_bytes:
            return None
        effective = namespace or str(pod["metadata"].get("namespace") or "") or "default"
        return (text, namespace, scheduler_name, do_not_disrupt, generation,
                workload_name(pod, effective, view))

    def _store(self, key: Hashable, entry: _Entry) -> None:
        self._entries[key] = entry
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


def _text(pod: KubeObject, plain_json: bool) -> bytes | str:
    """The pod's JSON text for the key. bytes (orjson's) and str never compare equal, so the two kinds of
    text cannot meet in one key."""
    if plain_json:
        try:
            return orjson.dumps(pod)
        except orjson.JSONEncodeError:
            pass
    return _KEY_ENCODER.encode(pod)


def _entry(patch: list[PatchOp], gpu_positions: tuple[int, ...], mutation: Mutation) -> _Entry:
    inside = [i for i, op in enumerate(patch) if str(op["path"]).startswith(_CONTAINERS)]
    if not inside:
        # No container changed with this index, so the pod already carries its index (set_index keeps
        # it): no other index would change a container either.
        return _Entry(tuple(patch), (), (), mutation)
    first, last = inside[0], inside[-1]
    return _Entry(tuple(patch[:first]), tuple(patch[last + 1:]), gpu_positions, mutation)


def _index_ops(pod: KubeObject, positions: tuple[int, ...], index: int) -> list[PatchOp]:
    containers: list[dict[str, Any]] = pod["spec"]["containers"]
    before = [containers[p] for p in positions]
    after = json.loads(json.dumps(before))
    set_index(after, index)
    ops: list[PatchOp] = []
    for position, old, new in zip(positions, before, after, strict=True):
        ops += diff(old, new, f"{_CONTAINERS}{position}")
    return ops
