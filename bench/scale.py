"""The published scale run: kube-scheduler alone, with tf-extender and with the stateless floor extender,
in the same run on the same kwok nodes, at the sizes users of the anchors compare (not CI; hours on 2 cores).

Per size (NODES x 8 GPUs, PODS pods), each phase on its own namespace with the same unthrottled scheduler
configuration (qps 500 / burst 1000, so no phase is capped by a client rate limit):

- ``baseline``: kube-scheduler alone, whole GPUs (``nvidia.com/gpu: 1``; at most one pod per GPU);
- ``tf``: kube-scheduler + tf-extender, fractional pods (TensorFusion's benchmark shapes);
- ``tf-whole``: kube-scheduler + tf-extender, one whole GPU per pod (``isolation: shared``);
- ``expand``: right after ``tf-whole`` has taken every GPU (and before its pods go), K more whole-GPU pods
  and the real Karpenter: the time from a capacity-only failure to each pod bound on a new node
  (bench/capacity_failure.py);
- ``floor``: kube-scheduler + bench/floor_extender.py (no state; the same Binding and Event writes).

Reported: pods/s and its ratios to the baseline and to the floor, p50/p99 of each extender verb, the
extender's CPU ms per bound pod and RSS at the end, kube-apiserver requests per bound pod. The KAI-comparable
row is ``--kai``: 500 nodes, 4,000 one-GPU pods (KAI-Scheduler's published scale test placed 4,000 one-GPU
jobs on 500 kwok nodes in 6 min 38 s).

    python -m bench.scale --sizes 1000x10000,5000x50000   # the published sizes
    python -m bench.scale --sizes 100x1000 --kai           # what a 2-core machine gets through
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench import capacity_failure, fixtures
from bench.common import RESULTS_DIR, TMP_DIR, Table, log, ratio
from bench.e2e_throughput import (
    BASELINE_SCHEDULER,
    NAMESPACE_BASE,
    NAMESPACE_TF,
    UNTHROTTLED,
    create_nodes_and_gpus,
    delete_pods,
    fractional_pods,
    run_phase,
    start_extender,
    stop_process,
    whole_gpu_pods,
)

PUBLISHED = ((1000, 10000), (5000, 50000))
KAI = (500, 4000)
PHASES = ("baseline", "tf", "tf-whole", "expand", "floor")


# kube-apiserver deletes a collection's objects one at a time by default: 10,000 pods took minutes between
# phases (not measured, but the run's wall time)
APISERVER_ARGS = ["--delete-collection-workers=8"]


def whole_pod_count(nodes: int, pods: int) -> int:
    """A whole-GPU phase places at most one pod per GPU: 1,000 nodes x 8 GPUs hold 8,000 of 10,000 pods."""
    return min(pods, nodes * 8)


def whole_tf_pods(n: int, prefix: str = "tfw", namespace: str = NAMESPACE_TF) -> list[dict[str, Any]]:
    """One whole GPU per pod through tf-extender, in the webhook's canonical form."""
    pods = []
    for i in range(n):
        ann = fixtures.canonical_annotations(0, 0, 1, isolation="shared")
        pod = fixtures.gpu_pod(f"{prefix}-{i:05d}", ann, index=i % 128 + 1, namespace=namespace)
        pod["metadata"].pop("uid", None)
        pod.pop("status", None)
        pods.append(pod)
    return pods


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def run_size(cluster: Any, nodes: int, pods: int, phases: tuple[str, ...], timeout: float,
             expand_pods: int = 8, expansion_delay: float | None = None) -> dict[str, Any]:
    from bench.cluster import cpl

    kwok = cpl.start_kwok(cluster.cp, cluster.binaries["kwok"], cluster.binaries["kwok-stages"])
    workdir = TMP_DIR / "scale"
    workdir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"nodes": nodes, "pods": pods}
    try:
        create_nodes_and_gpus(cluster.api, nodes)
        last = [p for p in phases if p != "expand"][-1]
        for phase in phases:
            if phase == "expand":  # runs inside tf-whole, on its full pool
                continue
            port = cpl.free_port()
            cfg = cpl.scheduler_config(cluster.kubeconfig, f"http://127.0.0.1:{port}/scheduler")
            cfg.setdefault("clientConnection", {}).update(UNTHROTTLED)
            if phase == "baseline":
                cfg.pop("extenders", None)
                cfg["profiles"] = [{**cfg["profiles"][0], "schedulerName": BASELINE_SCHEDULER}]
                res = run_phase(cluster, f"kube-scheduler-scale-{phase}", NAMESPACE_BASE,
                                whole_gpu_pods(whole_pod_count(nodes, pods)), cfg, timeout, kwok_pid=kwok.pid)
                if phase != last:  # the cluster ends with the last phase: nothing to delete for
                    delete_pods(cluster.api, NAMESPACE_BASE, timeout=timeout)
            else:
                extender = start_extender(cluster, port, workdir, floor=phase == "floor")
                try:
                    batch = (whole_tf_pods(whole_pod_count(nodes, pods)) if phase == "tf-whole"
                             else fractional_pods(pods))
                    res = run_phase(cluster, f"kube-scheduler-scale-{phase}", NAMESPACE_TF, batch, cfg,
                                    timeout, extender_port=port, extender_pid=extender.pid,
                                    kwok_pid=kwok.pid)
                    res["extender_rss_mb"] = rss_mb(extender.pid)
                finally:
                    stop_process(extender)
                if phase == "tf-whole" and "expand" in phases:
                    out["expand"] = capacity_failure.measure(
                        cluster, NAMESPACE_TF, pods=expand_pods,
                        top_up=nodes * 8 - whole_pod_count(nodes, pods), delay=expansion_delay,
                        timeout=timeout, workdir=workdir / "expand")
                if phase != last:
                    delete_pods(cluster.api, NAMESPACE_TF, timeout=timeout)
            out[phase] = res
    finally:
        kwok.stop()
    return out


def table(runs: list[dict[str, Any]]) -> Table:
    t = Table("Scale run: pods/s and cost per pod, each phase beside kube-scheduler alone and the floor",
              ["nodes x 8 GPUs", "pods", "phase", "bound", "all bound after s", "pods/s", "/ kube-scheduler",
               "/ floor",
               "filter p50/p99 ms", "bind p50/p99 ms", "extender CPU ms/pod", "RSS MB", "API requests/pod"])
    for run in runs:
        base, floor = run.get("baseline", {}), run.get("floor", {})
        for phase in PHASES:
            x = run.get(phase)
            if not x or phase == "expand":
                continue
            verbs = x.get("extender", {})

            def q(verb: str, v: dict[str, Any] = verbs) -> str:
                got = v.get(verb) or {}
                p50, p99 = got.get("p50_s"), got.get("p99_s")
                return "-" if p50 is None else f"{1e3 * p50:.2f} / {1e3 * (p99 or 0):.2f}"

            cpu = x.get("cpu_seconds", {}).get("tf-extender")
            requests = sum(x.get("apiserver_requests", {}).values())
            t.add(run["nodes"], run["pods"], phase, f"{x['bound']}/{x['pods']}", x.get("wall_from_start_s"),
                  x["pods_per_s"],
                  ratio(x["pods_per_s"], base.get("pods_per_s")),
                  ratio(x["pods_per_s"], floor.get("pods_per_s")) if phase != "baseline" else None,
                  q("filter"), q("bind") if phase != "baseline" else "-",
                  round(1e3 * cpu / max(1, x["bound"]), 2) if cpu is not None else None,
                  x.get("extender_rss_mb"), round(requests / max(1, x["bound"]), 2))
    t.notes += [
        "Every phase unthrottled (kube-scheduler qps 500 / burst 1000); pods/s = (bound - 1) / (last bind - "
        "first bind); all bound after: from the scheduler's start to the last bind (pods created before it). "
        "API requests: every client's, kwok's and the benchmark's own watch included.",
    ]
    return t


def phase_groups(phases: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The phases one control plane runs each, with ``--fresh-per-phase``: every phase alone, but ``expand``
    with the ``tf-whole`` whose full pool it grows."""
    groups: list[tuple[str, ...]] = []
    for phase in phases:
        if phase == "expand" and groups and "tf-whole" in groups[-1]:
            groups[-1] = (*groups[-1], phase)
        else:
            groups.append((phase,))
    return groups


PHASE_LABELS = {"baseline": "kube-scheduler alone (whole GPUs)", "tf": "+ tf-extender, fractional",
                "tf-whole": "+ tf-extender, whole GPUs", "floor": "+ floor extender"}


def plot(runs: list[dict[str, Any]], out: Path) -> Path | None:
    """pods/s and extender CPU per pod for each size and phase, side by side, as a PNG."""
    from bench.common import ensure_pip

    if ensure_pip("matplotlib"):
        log("scale: matplotlib is not available: no plot")
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [f"{r['nodes']} x {r['pods']}" for r in runs]
    fig, (rate, cpu) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    width = 0.8 / len(PHASE_LABELS)
    for i, (phase, label) in enumerate(PHASE_LABELS.items()):
        xs = [k + (i - 1.5) * width for k in range(len(runs))]
        rate.bar(xs, [(r.get(phase) or {}).get("pods_per_s") or 0 for r in runs], width, label=label)
        per_pod = []
        for r in runs:
            x = r.get(phase) or {}
            seconds = (x.get("cpu_seconds") or {}).get("tf-extender")
            per_pod.append(1e3 * seconds / max(1, x["bound"]) if seconds is not None else 0)
        cpu.bar(xs, per_pod, width, label=label)
    for ax, title in ((rate, "pods bound per second"), (cpu, "extender CPU ms per bound pod")):
        ax.set_xticks(range(len(runs)), sizes)
        ax.set_xlabel("kwok nodes x pods (8 GPUs a node)")
        ax.set_title(title)
    rate.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default=",".join(f"{n}x{p}" for n, p in PUBLISHED),
                        help="comma list of NODESxPODS (default: the published 1000x10000,5000x50000)")
    parser.add_argument("--kai", action="store_true",
                        help="also the KAI-comparable row: 500x4000, one GPU each")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)}")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a phase may take")
    parser.add_argument("--expand-pods", type=int, default=8,
                        help="K: whole-GPU pods the expand phase adds to the full pool")
    parser.add_argument("--expansion-delay", type=float, default=None,
                        help="tf-extender --expansion-delay in the expand phase (default: the shipped one)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "scale.json", help="the figures' JSON")
    parser.add_argument("--fresh-per-phase", action="store_true",
                        help="a new control plane (nodes and GPUs made again) for each phase instead of "
                             "deleting the pods between phases: at 5,000 nodes kwok deletes bound pods at "
                             "about 22 a second, building a cluster is quicker")
    parser.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                        help="run nothing: print the tables of earlier runs' JSON files and plot them")
    args = parser.parse_args(argv)
    if args.report:
        runs = [run for path in args.report for run in json.loads(path.read_text())]
        print(table(runs).markdown())
        if any("expand" in run for run in runs):
            print(capacity_failure.table(runs).markdown())
        if (png := plot(runs, RESULTS_DIR / "scale.png")) is not None:
            print(f"plot: {png}")
        return
    try:
        sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",") if s]
    except ValueError:
        parser.error(f"--sizes wants NODESxPODS,..., not {args.sizes!r}")
    phases = tuple(p for p in args.phases.split(",") if p)
    if unknown := set(phases) - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    if "expand" in phases and "tf-whole" not in phases:
        parser.error("the expand phase runs on the pool tf-whole fills: --phases needs tf-whole with expand")
    if args.expand_pods < 1:
        parser.error(f"--expand-pods wants at least 1, not {args.expand_pods}")
    runs: list[dict[str, Any]] = []
    from bench.cluster import BenchCluster

    for nodes, pods in [*sizes, *([KAI] if args.kai else [])]:
        kai = (nodes, pods) == KAI and args.kai
        wanted = ("baseline", "tf-whole") if kai else phases
        groups = phase_groups(wanted) if args.fresh_per_phase else [wanted]
        started = time.monotonic()
        run: dict[str, Any] = {}
        for group in groups:
            cluster = BenchCluster(TMP_DIR / f"controlplane-scale-{nodes}", APISERVER_ARGS).start()
            try:
                run.update(run_size(cluster, nodes, pods, group, args.timeout, expand_pods=args.expand_pods,
                                    expansion_delay=args.expansion_delay))
            finally:
                cluster.stop()
            # each group's figures as soon as it ends: a run of hours keeps what it measured
            args.out.write_text(json.dumps([*runs, run], indent=1, default=str))
        run["wall_s"] = round(time.monotonic() - started, 1)
        runs.append(run)
        log(f"scale: {nodes}x{pods} done in {run['wall_s']} s")
        args.out.write_text(json.dumps(runs, indent=1, default=str))
    print(table(runs).markdown())
    if any("expand" in run for run in runs):
        print(capacity_failure.table(runs).markdown())


if __name__ == "__main__":
    main()
