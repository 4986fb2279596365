"""What-if (bench-only, not the product): ``tf-extender`` with the three hot paths the e2e profile found
patched at start-up, to measure the suggested fixes end to end before anyone changes extender/.

    python -m bench.whatif_extender serve --port 8080 --kubeconfig ...   (same arguments as tf-extender)

1. (shipped since: prioritize answers plain dicts, encoded with orjson);
2. ``AssumeCache.pending_index_holder`` looks at the reservations of the one node (an index by node)
   instead of scanning every reservation in flight (extender/scheduling/assume.py);
3. ``Metrics.count_rejections`` classifies each distinct message once and increments each reason class
   once per filter call (extender/metrics.py);
4. (``bind-pool``) the API client's connection pool holds 64 connections instead of urllib3's default
   (5 per CPU: 10 here, of which the watches keep several busy, so bind calls open and throw away TLS
   connections: "Connection pool is full, discarding connection"), and API calls run on 32 threads
   instead of 16 (extender/kube/client.py).

``TF_WHATIF_PATCHES`` (comma list of the names in ``PATCHES``) picks the patches; default: all.
Each patch keeps the shipped behaviour (same answers, same metric values); only the cost changes.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

PATCHES = ("pending-index-by-node", "count-rejections-once", "bind-pool")


def patch_pending_index() -> None:
    from extender.common.pods import TERMINAL_PHASES, pod_uid
    from extender.scheduling import assume

    cache = assume.AssumeCache

    def node_index(self: Any) -> dict[str, set[str]]:
        by_node: dict[str, set[str]] | None = self.__dict__.get("_whatif_reserved_by_node")
        if by_node is None:
            by_node = {}
            for uid, pod in self._reserved_pods.items():
                by_node.setdefault(pod.node, set()).add(uid)
            self.__dict__["_whatif_reserved_by_node"] = by_node
        return by_node

    reserve, release, drop = cache.reserve, cache.release, cache.forget

    def forget(self: Any, uid: str) -> None:
        pod = self._reserved_pods.get(uid)
        if pod is not None and pod.node is not None:
            node_index(self).get(pod.node, set()).discard(uid)

    def reserve_indexed(self: Any, pod: Mapping[str, Any], node: str, request: Any) -> Any:
        uid = pod_uid(pod)
        old = self._reserved_pods.get(uid)
        reservation = reserve(self, pod, node, request)  # on failure nothing changed: nothing to index
        if old is not None and old.node != node:
            node_index(self).get(old.node, set()).discard(uid)
        node_index(self).setdefault(node, set()).add(uid)
        return reservation

    def release_indexed(self: Any, reservation: Any) -> None:
        held = self._reservations.get(reservation.pod_uid)
        if held is not None and held[0] == reservation:
            forget(self, reservation.pod_uid)
        release(self, reservation)

    def drop_indexed(self: Any, uid: str) -> None:
        forget(self, uid)
        drop(self, uid)

    def pending_index_holder(self: Any, node: str, index: int, pod_uid: str) -> str | None:
        on_node = self._cluster.pods_by_node.get(node, set())
        candidates = [self._cluster.pods[uid] for uid in on_node]
        for uid in node_index(self).get(node, ()):
            pod = self._reserved_pods.get(uid)
            if pod is not None and pod.node == node and uid not in on_node:
                candidates.append(pod)
        for pod in sorted(candidates, key=lambda p: p.key):
            busy = pod.phase not in ("Running", *TERMINAL_PHASES)
            if pod.uid != pod_uid and pod.index == index and busy:
                return str(pod.key)
        return None

    cache.reserve = reserve_indexed  # type: ignore[method-assign]
    cache.release = release_indexed  # type: ignore[method-assign]
    cache.forget = drop_indexed  # type: ignore[method-assign]
    cache.pending_index_holder = pending_index_holder  # type: ignore[method-assign]


def patch_count_rejections() -> None:
    from extender.server import metrics

    classify = lru_cache(maxsize=4096)(metrics.reason_class)

    def count_rejections(self: metrics.Metrics, messages: Iterable[str]) -> None:
        for reason, n in Counter(classify(m) for m in messages).items():
            self.filter_rejections.labels(reason).inc(n)

    metrics.Metrics.count_rejections = count_rejections  # type: ignore[method-assign]


def patch_bind_pool(connections: int = 64, threads: int = 32) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes.client import rest

    from extender.kube import client as kube_client

    kube_client._EXECUTOR = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube-api")
    load = kube_client.load_api_client

    def load_api_client(kubeconfig: str | None) -> Any:
        api = load(kubeconfig)
        api.configuration.connection_pool_maxsize = connections
        api.rest_client = rest.RESTClientObject(api.configuration)
        return api

    kube_client.load_api_client = load_api_client


def main(argv: list[str] | None = None) -> int:
    import os

    chosen = [p.strip() for p in os.environ.get("TF_WHATIF_PATCHES", ",".join(PATCHES)).split(",") if p]
    unknown = set(chosen) - set(PATCHES)
    if unknown:
        raise SystemExit(f"unknown what-if patches: {sorted(unknown)}; known: {', '.join(PATCHES)}")
    apply = {"pending-index-by-node": patch_pending_index,
             "count-rejections-once": patch_count_rejections, "bind-pool": patch_bind_pool}
    for name in chosen:
        apply[name]()
    print(f"what-if patches: {', '.join(chosen)}", file=sys.stderr, flush=True)
    from extender.cli import main as extender_main

    return int(extender_main(argv if argv is not None else sys.argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
