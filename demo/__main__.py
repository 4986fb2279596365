"""``make demo`` (``python -m demo``): the whole product on a local control plane, with a small GPU cluster
and sample pods.

It starts etcd, kube-apiserver, kube-controller-manager, kwok (playing kubelet), tf-webhook, tf-extender,
kube-scheduler with the project's own configuration and the real Karpenter (KWOK provider), creates three
pools (one per placement mode) over nodes with GPUs of three models, submits sample pods through the API
server one by one, then grows a fourth pool with no GPU node from zero through Karpenter, and prints where
each landed and how full each node is. ``--once`` checks every placement against the expected one and
exits (0 when all match); without it the cluster keeps running until Ctrl-C, with a kubeconfig to explore
it.

The expected placements follow DESIGN §5: load = 0.7 x VRAM used % + 0.3 x TFLOPS used %, ties by name.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests import harness as cpl
from tests.harness.karpenter import Karpenter, start_karpenter

NAMESPACE = "demo"


@dataclass(frozen=True)
class Pool:
    name: str
    mode: str
    model: str
    tflops: str
    vram: str
    nodes: tuple[str, ...]
    default: bool = False


POOLS = (
    Pool("training", "CompactFirst", "H100", "989", "80Gi", ("h100-a", "h100-b")),
    Pool("inference", "LowLoadFirst", "L40S", "362", "48Gi", ("l40s-a", "l40s-b")),
    Pool("general", "NodeCompactGPULowLoad", "A100", "312", "40Gi", ("a100-a", "a100-b"), default=True),
)
GPUS_PER_NODE = 2


@dataclass(frozen=True)
class Sample:
    name: str
    annotations: dict[str, str]
    node: str | None  # expected node; None: stays Pending
    gpus: tuple[str, ...]  # expected GPUs (any order)
    why: str


def _ann(**values: str) -> dict[str, str]:
    return {f"tensor-fusion.ai/{key.replace('_', '-')}": value for key, value in values.items()}


SAMPLES = (
    Sample("train-1", _ann(gpupool="training", tflops_request="200", vram_request="20Gi"),
           "h100-a", ("h100-a-0",), "CompactFirst: empty pool, ties by name"),
    Sample("train-2", _ann(gpupool="training", tflops_request="200", vram_request="20Gi"),
           "h100-a", ("h100-a-0",), "CompactFirst: fullest node, fullest GPU"),
    Sample("train-3", _ann(gpupool="training", tflops_request="300", vram_request="40Gi", gpu_count="2"),
           "h100-a", ("h100-a-0", "h100-a-1"), "two GPUs of one node, fullest node"),
    Sample("infer-1", _ann(gpupool="inference", tflops_request="50", vram_request="8Gi"),
           "l40s-a", ("l40s-a-0",), "LowLoadFirst: empty pool, ties by name"),
    Sample("infer-2", _ann(gpupool="inference", tflops_request="50", vram_request="8Gi"),
           "l40s-b", ("l40s-b-0",), "LowLoadFirst: emptiest node"),
    Sample("infer-3", _ann(gpupool="inference", tflops_request="50", vram_request="8Gi"),
           "l40s-a", ("l40s-a-1",), "equal nodes: by name; emptiest GPU"),
    Sample("infer-4", _ann(gpupool="inference", tflops_request="50", vram_request="8Gi"),
           "l40s-b", ("l40s-b-1",), "emptiest node, emptiest GPU"),
    Sample("general-1", _ann(tflops_request="100", vram_request="10Gi"),
           "a100-a", ("a100-a-0",), "default pool (NodeCompactGPULowLoad), ties by name"),
    Sample("general-2", _ann(tflops_request="100", vram_request="10Gi"),
           "a100-a", ("a100-a-1",), "fullest node, emptiest GPU"),
    Sample("whole-gpu", _ann(isolation="shared"),
           "a100-b", ("a100-b-0",), "isolation=shared takes a whole idle GPU"),
    Sample("too-big", _ann(gpupool="training", tflops_request="1200", vram_request="8Gi"),
           None, (), "larger than any H100: stays Pending with the shortfall"),
)
BAD_SAMPLE = _ann(gpupool="training", tflops_request="lots", vram_request="8Gi")

# Scale-up with the real Karpenter (KWOK provider): pool "burst" has no GPU node at first, only a NodePool
# whose template carries the pool and GPU discovery labels. Expected node "new:<n>": the n-th node Karpenter
# launches for the pool (a NodeClaim the expander created).
BURST_POOL = "burst"
BURST_NODEPOOL = "burst-a100"
BURST_SAMPLES = (
    Sample("burst-1", _ann(gpupool=BURST_POOL, tflops_request="100", vram_request="50Gi"),
           "new:1", (), "no GPU node in pool burst: grown from zero out of its NodePool"),
    Sample("burst-2", _ann(gpupool=BURST_POOL, tflops_request="100", vram_request="20Gi"),
           "new:1", (), "fits beside burst-1 on the first new node"),
    Sample("burst-3", _ann(gpupool=BURST_POOL, tflops_request="100", vram_request="50Gi"),
           "new:2", (), "fits no GPU: a copy of the first new node"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--once", action="store_true", help="check the placements and exit")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the cluster's files and logs here")
    args = parser.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="tf-demo-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        cp, karpenter = start_everything(workdir)
        api = cp.api_client()
        create_cluster(api)
        results = submit_samples(api)
        results += scale_up(cp, api, karpenter)
        print_report(api, results)
        ok = all(r.matches for r in results)
        print(f"\n{'every sample pod was placed as expected' if ok else 'SOME PLACEMENTS DIFFER'}"
              f"  (logs: {cp.log_dir})")
        if args.once:
            return 0 if ok else 1
        print(f"\nThe cluster keeps running. Explore it:\n  export KUBECONFIG={cp.kubeconfig}\n"
              f"  kubectl get pods -n {NAMESPACE} -o wide; kubectl get gpus\nCtrl-C stops everything.")
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
        return 0
    finally:
        cpl.PROCESSES.stop_all()


def start_everything(workdir: Path) -> tuple[cpl.ControlPlane, Karpenter]:
    step("building or reusing etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok and "
         "Karpenter")
    binaries = cpl.build_binaries()
    step("starting etcd and kube-apiserver")
    cp = cpl.ControlPlane(workdir, binaries)
    cp.start()
    api = cp.api_client()
    cpl.apply_crds(api, cpl.project_crd_files())
    step("starting kube-controller-manager (ReplicaSets, Deployments, Jobs, PDBs, garbage collection)")
    cpl.start_controller_manager(cp, binaries["kube-controller-manager"])
    step("starting kwok (plays kubelet for the demo's nodes)")
    cpl.start_kwok(cp, binaries["kwok"], binaries["kwok-stages"])
    step("starting tf-webhook (certificates from tf-certs) and registering it")
    cpl.start_webhook(cp, api, default_pool=None)  # the demo brings its own default pool
    port = cpl.free_port()
    step("starting tf-extender")
    cpl.ExtenderRunner(cp, port).ensure(log_level="info")
    step("starting kube-scheduler with manifests/scheduler/kube-scheduler-config.yaml")
    cpl.start_scheduler(cp, binaries["kube-scheduler"], f"http://127.0.0.1:{port}/scheduler")
    step("starting Karpenter (KWOK provider, GPU instance types) with its CRDs")
    karpenter = start_karpenter(cp, api, binaries)
    return cp, karpenter


def create_cluster(api: Any) -> None:
    step("creating pools, nodes and GPUs")
    custom = client.CustomObjectsApi(api)
    for pool in POOLS:
        template = {"apiVersion": "tensor-fusion.ai/v1", "kind": "SchedulingConfigTemplate",
                    "metadata": {"name": f"{pool.name}-template"}, "spec": {"placement": {"mode": pool.mode}}}
        annotations = {cpl.DEFAULT_POOL_ANNOTATION: "true"} if pool.default else {}
        gpupool = {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
                   "metadata": {"name": pool.name, "annotations": annotations},
                   "spec": {"schedulingConfigTemplate": f"{pool.name}-template"}}
        for plural, body in (("schedulingconfigtemplates", template), ("gpupools", gpupool)):
            with contextlib.suppress(ApiException):
                custom.create_cluster_custom_object("tensor-fusion.ai", "v1", plural, body)
        for node in pool.nodes:
            cpl.create_node(api, node, labels={"tensor-fusion.ai/gpupool": pool.name})
            for index in range(GPUS_PER_NODE):
                cpl.create_gpu(api, f"{node}-{index}", node, pool=pool.name, model=pool.model,
                               tflops=pool.tflops, vram=pool.vram, index=index)
    for pool in POOLS:
        cpl.wait_for_webhook_pool(api, pool.name)
    with contextlib.suppress(ApiException):
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})


@dataclass
class Result:
    sample: Sample
    node: str | None
    gpus: tuple[str, ...]
    message: str
    new_node: str | None = None  # "new:<n>" for a node Karpenter launched during the demo

    @property
    def matches(self) -> bool:
        if self.new_node is not None:
            return self.new_node == self.sample.node
        return self.node == self.sample.node and sorted(self.gpus) == sorted(self.sample.gpus)


def scale_up(cp: cpl.ControlPlane, api: Any, karpenter: Karpenter) -> list[Result]:
    step(f"scale-up: pool {BURST_POOL} has no GPU node, only Karpenter NodePool {BURST_NODEPOOL}")
    cpl.create_cluster_object(api, "gpupools", {"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool",
                                                "metadata": {"name": BURST_POOL}, "spec": {}})
    cpl.wait_for_webhook_pool(api, BURST_POOL)
    karpenter.nodepool(BURST_POOL, name=BURST_NODEPOOL, instance_type="gpu-a100-1")
    core = client.CoreV1Api(api)
    order: list[str] = []  # Karpenter's nodes in the order they appeared
    results = []
    for sample in BURST_SAMPLES:
        core.create_namespaced_pod(NAMESPACE, cpl.gpu_pod_body(sample.name, annotations=sample.annotations))
        node, gpus = cpl.placement(api, NAMESPACE, sample.name, timeout=180)
        if node not in order:
            order.append(node)
        results.append(Result(sample, node, tuple(gpus), "", new_node=f"new:{order.index(node) + 1}"))
    claims = karpenter.claims(BURST_NODEPOOL)
    ours = [c for c in claims if "tensor-fusion.ai/expansion" in (c["metadata"].get("labels") or {})]
    print(f"\nKarpenter launched {len(claims)} NodeClaims in NodePool {BURST_NODEPOOL}, {len(ours)} of them "
          f"created by the expander: {', '.join(c['metadata']['name'] for c in claims)}")
    return results


def submit_samples(api: Any) -> list[Result]:
    step("submitting sample pods through the API server, one at a time")
    core = client.CoreV1Api(api)
    results = []
    for sample in SAMPLES:
        body = cpl.gpu_pod_body(sample.name, annotations=sample.annotations)
        core.create_namespaced_pod(NAMESPACE, body)
        if sample.node is None:
            message = cpl.wait_until(lambda s=sample: cpl.scheduling_failure(api, NAMESPACE, s.name), 60,
                                     what=f"{sample.name} to be reported unschedulable")
            results.append(Result(sample, None, (), message))
            continue
        node, gpus = cpl.placement(api, NAMESPACE, sample.name, timeout=60)
        results.append(Result(sample, node, tuple(gpus), ""))
    try:
        core.create_namespaced_pod(NAMESPACE, cpl.gpu_pod_body("bad-request", annotations=BAD_SAMPLE))
        denial = "ACCEPTED (unexpected)"
    except ApiException as exc:
        denial = exc.body if isinstance(exc.body, str) else str(exc)
    print(f"\na pod with tflops-request=\"lots\" is refused by the webhook:\n  {_status_message(denial)}")
    return results


def print_report(api: Any, results: list[Result]) -> None:
    rows = [("pod", "node", "GPUs", "expected", "why")]
    for r in results:
        got = f"{r.new_node or r.node} {','.join(r.gpus)}" if r.node else "Pending"
        node = f"{r.node} ({r.new_node})" if r.new_node else r.node or "Pending"
        rows.append((r.sample.name, node, ",".join(sorted(r.gpus)) or "-",
                     "ok" if r.matches else f"MISMATCH (wanted {r.sample.node} {r.sample.gpus}, got {got})",
                     r.sample.why))
    print()
    _table(rows)
    for r in results:
        if r.message:
            print(f"\n{r.sample.name} is Pending; the scheduler says:\n  {r.message}")
    print()
    _table(node_utilisation(api))


def node_utilisation(api: Any) -> list[tuple[str, ...]]:
    """Per node, from the stored objects: GPUs in use and allocated TFLOPS / VRAM (requests x GPUs)."""
    from extender.common.contract import parse_gpu_ids, parse_request
    from extender.common.quantity import parse_quantity

    custom = client.CustomObjectsApi(api)
    gpus = {g["metadata"]["name"]: g["status"]
            for g in custom.list_cluster_custom_object("tensor-fusion.ai", "v1", "gpus")["items"]}
    used: dict[str, list[float]] = {name: [0.0, 0.0] for name in gpus}
    for pod in client.CoreV1Api(api).list_namespaced_pod(NAMESPACE).items:
        annotations = pod.metadata.annotations or {}
        ids = parse_gpu_ids(annotations.get("tensor-fusion.ai/gpu-ids"))
        if not ids or not pod.spec.node_name:
            continue
        request = parse_request(annotations)
        for gpu in ids:
            if gpu not in gpus:  # a Karpenter node's GPUs come from its discovery labels, not GPU objects
                continue
            capacity = gpus[gpu]["capacity"]
            tflops = parse_quantity(capacity["tflops"]).value
            vram = int(parse_quantity(capacity["vram"]).value)
            used[gpu][0] += float(request.tflops_on(tflops) / tflops)
            used[gpu][1] += request.vram_on(vram) / vram
    rows = [("node", "model", "GPUs used", "TFLOPS %", "VRAM %")]
    for pool in POOLS:
        for node in pool.nodes:
            names = [f"{node}-{i}" for i in range(GPUS_PER_NODE)]
            busy = sum(1 for n in names if used[n][1] > 0 or used[n][0] > 0)
            tflops = 100 * sum(used[n][0] for n in names) / len(names)
            vram = 100 * sum(used[n][1] for n in names) / len(names)
            rows.append((node, pool.model, f"{busy}/{len(names)}", f"{tflops:.1f}", f"{vram:.1f}"))
    return rows


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * width for width in widths))


def _status_message(body: str) -> str:
    import json

    with contextlib.suppress(ValueError, TypeError):
        return str(json.loads(body).get("message", body))
    return body


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
