"""``simulate`` and ``plan`` on a 2,000-pod snapshot: what a user waits for at the command line.

The snapshot is ``kubectl get -o yaml``-sized YAML written to a temporary folder: 200 nodes of 8 GPUs with
2,000 bound pods (``fixtures.cluster_objects``, about half of every GPU allocated), a default pool, and
2,000 pending pods of the five bench shapes. Measured:

- the console scripts end to end (``tf-extender simulate --cluster C --pods P``; ``tf-extender plan
  --cluster C --defrag``), wall time of a fresh process, as a user runs them;
- the YAML load alone with PyYAML's pure-Python ``SafeLoader`` and with libyaml's ``CSafeLoader`` (which the
  tools use where PyYAML has it), in this process.

    python -m bench.offline_tools [--pods 2000]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import VENV_BIN, BenchResult, Table, Target, log
from bench.fixtures import POD_SHAPES, ClusterSpec, cluster_objects, pending_pod, pool_objects

TARGET_SECONDS = 5.0  # "a few seconds" at 2,000 pods (issue 29)
PODS_PER_NODE = 10  # fixtures.cluster_objects: 8 GPUs, one GPU in four split over two pods


def write_snapshot(folder: Path, pods: int) -> tuple[Path, Path]:
    nodes = max(1, pods // PODS_PER_NODE)
    cluster = [*pool_objects(), *(obj for _kind, obj in cluster_objects(ClusterSpec(nodes=nodes)))]
    pending = [pending_pod(POD_SHAPES[i % len(POD_SHAPES)], name=f"pending-{i}", index=i % 128 + 1)
               for i in range(pods)]
    dump = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    cluster_file, pods_file = folder / "cluster.yaml", folder / "pods.yaml"
    cluster_file.write_text(yaml.dump_all(cluster, Dumper=dump, sort_keys=False))
    pods_file.write_text(yaml.dump_all(pending, Dumper=dump, sort_keys=False))
    return cluster_file, pods_file


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(argv: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall time and CPU time (user + system) of one run of a command."""
    t0, cpu0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    elapsed, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return elapsed, cpu, proc


def _load_seconds(path: Path, loader: Any) -> float:
    text = path.read_text()
    t0 = time.perf_counter()
    list(yaml.load_all(text, Loader=loader))
    return time.perf_counter() - t0


def run(quick: bool = False, pods: int | None = None) -> BenchResult:
    pods = pods or (500 if quick else 2000)
    tool = str(VENV_BIN / "tf-extender")
    with tempfile.TemporaryDirectory(prefix="tf-bench-offline-") as tmp:
        cluster_file, pods_file = write_snapshot(Path(tmp), pods)
        sizes = {"cluster_mb": round(cluster_file.stat().st_size / 1e6, 1),
                 "pods_mb": round(pods_file.stat().st_size / 1e6, 1)}
        log(f"offline_tools: snapshot of {pods} bound + {pods} pending pods ({sizes})")
        simulate_s, simulate_cpu, sim = _timed([tool, "simulate", "--cluster", str(cluster_file),
                                                "--pods", str(pods_file)])
        placed = sum(1 for line in sim.stdout.splitlines() if '"node": null' not in line)
        plan_s, plan_cpu, planned = _timed([tool, "plan", "--cluster", str(cluster_file), "--defrag"])
        actions = len(planned.stdout.splitlines())
        as_json = Path(tmp) / "cluster.json"  # what kubectl get -o json writes
        as_json.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": list(
            yaml.load_all(cluster_file.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))}))
        plan_json_s, plan_json_cpu, _ = _timed([tool, "plan", "--cluster", str(as_json), "--defrag"])
        loads = {}
        candidates = (("SafeLoader", yaml.SafeLoader), ("CSafeLoader", getattr(yaml, "CSafeLoader", None)))
        for name, loader in candidates:
            if loader is not None:
                loads[name] = sum(_load_seconds(f, loader) for f in (cluster_file, pods_file))
    table = Table(f"Offline tools on a {pods}-pod snapshot ({pods // PODS_PER_NODE} nodes, "
                  f"{pods // PODS_PER_NODE * 8} GPUs, {pods} bound pods; {pods} pods to place)",
                  ["measure", "wall s", "CPU s", "notes"])
    table.add("tf-extender simulate (process, end to end)", round(simulate_s, 2), round(simulate_cpu, 2),
              f"{placed}/{pods} pods placed")
    table.add("tf-extender plan --defrag, YAML snapshot", round(plan_s, 2), round(plan_cpu, 2),
              f"{actions} actions")
    table.add("tf-extender plan --defrag, the same as JSON", round(plan_json_s, 2), round(plan_json_cpu, 2),
              "one List document")
    for name, seconds in loads.items():
        table.add(f"YAML load of both files, {name}", round(seconds, 2), None, "in-process")
    table.notes.append("CPU s is what the run costs on an idle core; wall s also counts waiting for a core "
                       "on a loaded machine.")
    if len(loads) == 2:
        speedup = loads["SafeLoader"] / loads["CSafeLoader"]
        table.notes.append(f"libyaml's loader reads the snapshot {speedup:.1f}x faster than the pure-Python "
                           "one.")
    targets = [Target(f"simulate at {pods} pods (CPU)", round(simulate_cpu, 2), "<=", TARGET_SECONDS, "s"),
               Target(f"plan at {pods} pods (CPU)", round(plan_cpu, 2), "<=", TARGET_SECONDS, "s")]
    data = {"pods": pods, **sizes, "simulate_s": simulate_s, "simulate_cpu_s": simulate_cpu,
            "plan_s": plan_s, "plan_cpu_s": plan_cpu, "plan_json_s": plan_json_s,
            "plan_json_cpu_s": plan_json_cpu, "placed": placed, "plan_actions": actions, "yaml_load_s": loads}
    return BenchResult("offline_tools", data, [table], targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args(argv)
    result = run(pods=args.pods)
    for table in result.tables:
        print(table.markdown())
    for target in result.targets:
        print(*target.row())


if __name__ == "__main__":
    main()
