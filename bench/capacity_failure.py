"""From a capacity-only failure to the pod bound on a new node, on the scale run's full pool (not CI).

The scale run's ``tf-whole`` phase leaves every GPU of the pool taken by a one-whole-GPU pod bound through
tf-extender. On that cluster ``measure`` then starts what the expander needs and times it:

- the real Karpenter (its KWOK cloud provider, tests/harness/karpenter.py) with one NodePool for the pool:
  instance type ``bench-gpu-8`` (8 GPUs), consolidation off;
- tf-extender with expansion on (the e2e suite's flags, tests/harness/expansion.py; the shipped expansion
  delay unless told) and ``--node-provisioner karpenter``, and a kube-scheduler using it;
- ``GpuAgent``: a watch that gives each new Node of the NodePool its GPU objects (what TensorFusion's node
  agent does on a real node);
- the template: the expander copies a node that a Karpenter NodeClaim owns, and the scale run's nodes are
  made by hand (no NodeClaim), so one NodeClaim written here (as an operator would apply one) buys a first
  node of the NodePool, which is filled like the others before the measured pods come. In a cluster that
  Karpenter runs, every GPU node is such a node. The scheduler sends every node to the filter
  (``percentageOfNodesToScore: 100``) so that this one node is among each pod's candidates.

Then K one-whole-GPU pods in the webhook's canonical form are created, and measured: per pod the seconds
from its creation to spec.nodeName on a node that did not exist before (polled every 0.2 s), the seconds to
the first NodeClaim the expander created, the NodeClaims bought against the ceil(K / 8) the pods need, and
that no pod landed on an old node. Everything made here is removed at the end (the pool's old pods stay).

    python -m bench.capacity_failure --nodes 20        # fills 20 kwok nodes x 8 GPUs first (scale code)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import TMP_DIR, Table, log

NODEPOOL = "bench-gpu-8"
INSTANCE_TYPE = "bench-gpu-8"
GPUS_PER_NODE = 8
LEASE_NAMESPACE = "bench-expand"
POLL_S = 0.2
PHASE_LABEL = "bench.tensor-fusion.ai/phase"
TITLE = "Capacity-only failure to a bound pod on a new node"


def _karpenter_settings() -> Any:
    from tests.harness.karpenter import InstanceType, KarpenterSettings

    gpu8 = InstanceType(INSTANCE_TYPE, gpus=GPUS_PER_NODE, cpu="64", memory="512Gi", price=8.0)
    # info, not debug: at 1,000 nodes Karpenter's debug log is the busiest writer on the machine
    return KarpenterSettings(instance_types=(gpu8,), log_level="info")


class GpuAgent:
    """Stands in for TensorFusion's GPU discovery (its node agent): for every Node of ``nodepool`` that
    appears, creates its 8 GPU objects in ``pool`` (as ``Karpenter.give_gpus`` does in the e2e tests), so
    tf-extender sees the node's GPUs once it has registered. ``gpus_at``: when each node got them."""

    def __init__(self, karpenter: Any, nodepool: str, pool: str) -> None:
        self.karpenter, self.nodepool, self.pool = karpenter, nodepool, pool
        self.gpus_at: dict[str, float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-agent", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import client, watch

        from tests.harness.karpenter import NODEPOOL_LABEL

        core = client.CoreV1Api(self.karpenter.api_client)
        selector = f"{NODEPOOL_LABEL}={self.nodepool}"
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(core.list_node, label_selector=selector, timeout_seconds=5):
                    name = event["object"].metadata.name
                    if event["type"] in ("ADDED", "MODIFIED") and name not in self.gpus_at:
                        self.karpenter.give_gpus(name, self.pool, count=GPUS_PER_NODE)
                        self.gpus_at[name] = time.monotonic()
                        log(f"capacity: node {name} registered; its {GPUS_PER_NODE} GPU objects created")
                    if self._stop.is_set():
                        break
            except Exception as exc:  # keep watching: a lost node would be a missing figure
                self.errors.append(repr(exc))
                time.sleep(0.5)
            finally:
                w.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _extender_args(delay: float) -> tuple[str, ...]:
    """tf-extender serve flags: the e2e suite's expansion flags with a Lease namespace of the phase's own
    (a fresh Lease: the new replica leads at once) and Karpenter as the only provisioner."""
    from tests.harness.expansion import extender_flags

    flags = {**extender_flags(LEASE_NAMESPACE, delay=delay), "node_provisioner": "karpenter"}
    argv: list[str] = []
    for key, value in flags.items():
        durations = ("expansion_delay", "expansion_claim_timeout")  # Go durations, as the chart writes them
        argv += ["--" + key.replace("_", "-"), f"{value:g}s" if key in durations else str(value)]
    return tuple(argv)


def _seed_claim(karpenter: Any, nodepool: str) -> dict[str, Any]:
    """A NodeClaim of ``nodepool`` as Karpenter itself writes one (no expander labels)."""
    from tests.harness.karpenter import KARPENTER, NODEPOOL_LABEL

    pool = karpenter.custom.get_cluster_custom_object(*KARPENTER, "nodepools", nodepool)
    template = pool["spec"]["template"]
    spec = {k: v for k, v in template["spec"].items() if k in ("nodeClassRef", "requirements", "taints",
                                                                  "expireAfter")}
    spec["requirements"] = [*spec["requirements"],
                            {"key": NODEPOOL_LABEL, "operator": "In", "values": [nodepool]}]
    labels = {**(template["metadata"].get("labels") or {}), NODEPOOL_LABEL: nodepool}
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"generateName": f"{nodepool}-seed-", "labels": labels,
                         "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                                              "name": nodepool, "uid": pool["metadata"]["uid"]}]},
            "spec": spec}


def _pods(prefix: str, n: int, namespace: str) -> list[dict[str, Any]]:
    from bench.scale import whole_tf_pods

    pods = whole_tf_pods(n, prefix=prefix, namespace=namespace)
    for pod in pods:
        pod["metadata"]["labels"][PHASE_LABEL] = "expand"
    return pods


def _create(core: Any, namespace: str, pods: list[dict[str, Any]]) -> dict[str, float]:
    from bench.e2e_throughput import drain

    created: dict[str, float] = {}
    for pod in pods:
        t = time.monotonic()
        drain(core.create_namespaced_pod(namespace, pod, _preload_content=False))
        created[pod["metadata"]["name"]] = t
    return created


def _placed(core: Any, namespace: str) -> dict[str, str]:
    """This phase's pods that have a node: {pod: node}."""
    listing = json.loads(core.list_namespaced_pod(namespace, label_selector=f"{PHASE_LABEL}=expand",
                                                  _preload_content=False).data)
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in listing["items"]
            if (p.get("spec") or {}).get("nodeName")}


def _wait_placed(core: Any, namespace: str, names: list[str], timeout: float, what: str) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        placed = _placed(core, namespace)
        if all(n in placed for n in names):
            return placed
        if time.monotonic() > deadline:
            got = sum(n in placed for n in names)
            raise TimeoutError(f"{what}: {got}/{len(names)} bound after {timeout}s")
        time.sleep(0.5)


def _wait_leader(port: int, timeout: float = 120) -> None:
    from bench.e2e_throughput import fetch

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if fetch(f"http://127.0.0.1:{port}/readyz").startswith("ok: leader"):
                return
        time.sleep(0.5)
    raise TimeoutError(f"tf-extender on port {port} did not lead within {timeout}s")


def measure(cluster: Any, namespace: str, pods: int = 8, top_up: int = 0, delay: float | None = None,
            timeout: float = 600, workdir: Path | None = None) -> dict[str, Any]:
    """On ``cluster`` whose pool is full (every GPU taken by a whole-GPU pod in ``namespace``, bar
    ``top_up`` free ones that are filled first), the time from ``pods`` more whole-GPU pods to each bound
    on a new node. The kwok that makes Karpenter's nodes Ready must be running."""
    from kubernetes import client

    from bench import fixtures
    from bench.cluster import cpl, ensure_namespace
    from bench.e2e_throughput import UNTHROTTLED, start_extender, stop_process
    from extender.common.labels import EXPANSION_LABEL
    from extender.controllers.expansion.config import DEFAULT_DELAY_SECONDS
    from tests.harness.karpenter import KARPENTER, NODEPOOL_LABEL, start_karpenter

    delay = DEFAULT_DELAY_SECONDS if delay is None else delay
    workdir = workdir or TMP_DIR / "capacity"
    workdir.mkdir(parents=True, exist_ok=True)
    api, core = cluster.api, client.CoreV1Api(cluster.api)
    ensure_namespace(api, LEASE_NAMESPACE)
    old_nodes = {n.metadata.name for n in core.list_node().items}
    karpenter = start_karpenter(cluster.cp, api, cluster.binaries, _karpenter_settings())
    agent: GpuAgent | None = None
    extender = sched = None
    try:
        nodepool = karpenter.nodepool(fixtures.POOL, name=NODEPOOL, instance_type=INSTANCE_TYPE,
                                      gpu_labels=False)
        agent = GpuAgent(karpenter, nodepool, fixtures.POOL)
        port = cpl.free_port()
        extender = start_extender(cluster, port, workdir, extra_args=_extender_args(delay))
        _wait_leader(port)
        cfg = cpl.scheduler_config(cluster.kubeconfig, f"http://127.0.0.1:{port}/scheduler")
        cfg.setdefault("clientConnection", {}).update(UNTHROTTLED)
        cfg["percentageOfNodesToScore"] = 100
        sched = cpl.start_scheduler(cluster.cp, cluster.binaries["kube-scheduler"], "",
                                    name="kube-scheduler-expand", config=cfg, timeout=180)
        if top_up:  # the sizes whose tf-whole phase left GPUs free
            top = _pods("top", top_up, namespace)
            _create(core, namespace, top)
            _wait_placed(core, namespace, [p["metadata"]["name"] for p in top], timeout, "top-up pods")
            log(f"capacity: {top_up} more whole-GPU pods fill the pool")
        seed = karpenter.custom.create_cluster_custom_object(*KARPENTER, "nodeclaims",
                                                             _seed_claim(karpenter, nodepool))
        seed_node = karpenter.node_of_claim(seed["metadata"]["name"], timeout=timeout)
        cpl.wait_until(lambda: seed_node in agent.gpus_at, 60, what="the seed node's GPUs")
        fill = _pods("seed", GPUS_PER_NODE, namespace)
        _create(core, namespace, fill)
        names = [p["metadata"]["name"] for p in fill]
        seeded = {n: node for n, node in _wait_placed(core, namespace, names, timeout, "seed pods").items()
                  if n in names}
        if set(seeded.values()) != {seed_node}:
            raise RuntimeError(f"the seed node's pods went elsewhere: {seeded}")
        before = {c["metadata"]["name"] for c in karpenter.claims()}
        log(f"capacity: pool full ({len(old_nodes)} nodes and {seed_node}); {pods} more pods")

        batch = _pods("cap", pods, namespace)
        t0 = time.monotonic()
        created = _create(core, namespace, batch)
        bound_at: dict[str, float] = {}
        first_claim: float | None = None
        deadline = t0 + timeout
        placed: dict[str, str] = {}
        while time.monotonic() < deadline:
            now = time.monotonic()
            placed = {n: node for n, node in _placed(core, namespace).items() if n in created}
            for name in placed:
                bound_at.setdefault(name, now)
            if first_claim is None and any(c["metadata"]["name"] not in before for c in karpenter.claims()):
                first_claim = now
            if len(placed) == len(created):
                break
            karpenter.check_alive()
            time.sleep(POLL_S)
        new_claims = [c for c in karpenter.claims() if c["metadata"]["name"] not in before]
        on_old = sorted(n for n, node in placed.items() if node in old_nodes or node == seed_node)
        on_new = {n: round(bound_at[n] - created[n], 2) for n in placed if n not in on_old}
        seconds = list(on_new.values())
        new_nodes = [t for node, t in agent.gpus_at.items() if node != seed_node]
        needed = math.ceil(pods / GPUS_PER_NODE)
        out: dict[str, Any] = {
            "pods": pods, "bound": len(on_new), "top_up": top_up, "expansion_delay_s": delay,
            "first_nodeclaim_after_s": round(first_claim - t0, 2) if first_claim is not None else None,
            # when the watch standing in for the node agent saw the first new node (and gave it its GPUs)
            "first_new_node_after_s": round(min(new_nodes) - t0, 2) if new_nodes else None,
            "time_to_bound_s": {n: on_new.get(n) for n in created},  # None: not bound on a new node
            "time_to_bound_p50_s": round(statistics.median(seconds), 2) if seconds else None,
            "time_to_bound_max_s": max(seconds) if seconds else None,
            "nodeclaims_bought": len(new_claims),
            "nodeclaims_by_expander": sum(EXPANSION_LABEL in (c["metadata"].get("labels") or {})
                                          for c in new_claims),
            "nodeclaims_needed": needed,
            "new_nodes_used": sorted(set(placed.values()) - old_nodes - {seed_node}),
            "pods_on_old_nodes": on_old,
            "gpu_agent_errors": agent.errors,
            "nodepool_label": f"{NODEPOOL_LABEL}={nodepool}",
        }
        out["ok"] = (out["bound"] == pods and not on_old and out["nodeclaims_bought"] == needed)
        log(f"capacity: {out['bound']}/{pods} bound on new nodes, first NodeClaim after "
            f"{out['first_nodeclaim_after_s']} s, p50/max {out['time_to_bound_p50_s']}/"
            f"{out['time_to_bound_max_s']} s, NodeClaims {out['nodeclaims_bought']}/{needed}")
        return out
    finally:
        if sched is not None:
            sched.stop()
        if extender is not None:
            stop_process(extender)
        if agent is not None:
            agent.stop()
        # Karpenter drains a node before it lets it go: the pods on its nodes go first
        with contextlib.suppress(Exception):
            core.delete_collection_namespaced_pod(namespace, label_selector=f"{PHASE_LABEL}=expand",
                                                  grace_period_seconds=0)
        karpenter.close()


def table(runs: list[dict[str, Any]]) -> Table:
    """One row per size that ran the expand phase."""
    t = Table(TITLE, ["nodes x 8 GPUs", "K pods", "bound on a new node", "first NodeClaim after s",
                      "first new node after s", "time to bound p50 / max s", "NodeClaims bought / needed",
                      "pods on old nodes"])
    for run in runs:
        x = run.get("expand")
        if not x:
            continue
        t.add(run["nodes"], x["pods"], f"{x['bound']}/{x['pods']}", x["first_nodeclaim_after_s"],
              x.get("first_new_node_after_s"), f"{x['time_to_bound_p50_s']} / {x['time_to_bound_max_s']}",
              f"{x['nodeclaims_bought']} / {x['nodeclaims_needed']}", len(x["pods_on_old_nodes"]))
    t.notes += [
        "After the tf-whole phase has taken every GPU of the pool: the real Karpenter (KWOK provider, one "
        "NodePool of 8-GPU nodes) and tf-extender with expansion on (expansion delay "
        f"{runs[0].get('expand', {}).get('expansion_delay_s') if runs else '-'} s: the time it leaves the "
        "scheduler to find room before it buys); K more one-whole-GPU pods. Time to bound: from each pod's "
        "creation to spec.nodeName on a new node; first NodeClaim, first new node (registered): from the "
        "first pod's creation. A watch "
        "in the benchmark gives each new node its GPU objects (TensorFusion's node agent on a real node); "
        "the expander copies one Karpenter node of the pool, bought and filled before (the benchmark's other "
        "nodes are made by hand, not by Karpenter).",
    ]
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=20, help="kwok nodes x 8 GPUs to fill first")
    parser.add_argument("--pods", type=int, default=8, help="whole-GPU pods that need new nodes (K)")
    parser.add_argument("--expansion-delay", type=float, default=None,
                        help="tf-extender --expansion-delay in seconds (default: the shipped one)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a step may take")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.pods < 1:
        parser.error(f"--nodes and --pods want at least 1, not {args.nodes} and {args.pods}")
    from bench.cluster import BenchCluster
    from bench.scale import APISERVER_ARGS, run_size

    cluster = BenchCluster(TMP_DIR / f"controlplane-capacity-{args.nodes}", APISERVER_ARGS).start()
    try:
        run = run_size(cluster, args.nodes, args.nodes * GPUS_PER_NODE, ("tf-whole", "expand"), args.timeout,
                       expand_pods=args.pods, expansion_delay=args.expansion_delay)
    finally:
        cluster.stop()
    out = TMP_DIR / "capacity_failure.json"
    out.write_text(json.dumps(run, indent=1, default=str))
    log(f"capacity: figures in {out}")
    print(table([run]).markdown())


if __name__ == "__main__":
    main()
