"""``kubectl tf status`` against the real control plane, as kubectl runs a plugin: the ``kubectl-tf``
console script with the user's environment (``KUBECONFIG``) and a context picked by ``--context``.

The kubeconfig has two contexts: the current one points at a port nothing listens on, ``e2e`` at the
control plane, so only ``--context e2e`` reads the cluster. ``-n`` narrows the pending pods to one
namespace; ``--watch`` prints screen after screen until interrupted and exits 0; a context whose server is
down is one line on stderr.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests import harness as cpl

pytestmark = pytest.mark.e2e

CAP = {"tflops": "100", "vram": "100Gi"}


@pytest.fixture
def kubeconfig(control_plane, tmp_path) -> Path:
    cfg = yaml.safe_load(control_plane.kubeconfig.read_text())
    cfg["clusters"].append({"name": "down", "cluster": {"server": f"https://127.0.0.1:{cpl.free_port()}",
                                                        "insecure-skip-tls-verify": True}})
    cfg["contexts"].append({"name": "down", "context": {"cluster": "down", "user": cfg["users"][0]["name"]}})
    cfg["current-context"] = "down"
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _plugin(kubeconfig: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cpl.console_script("kubectl-tf")), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "KUBECONFIG": str(kubeconfig)})


def test_kubectl_tf_status_reads_the_context_it_is_given(
        kubeconfig, api_client, gpu_cluster, namespace, make_pool, make_gpu, make_node, extender):
    pool = make_pool("CompactFirst")
    node = f"kt-{uuid.uuid4().hex[:6]}"
    make_gpu(f"{node}-gpu-0", node, pool=pool, index=0, **CAP)
    make_node(node)
    extender.wait_node_allocated(node, 0.0)
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("fits", pool=pool, tflops="30", vram="20Gi"))
    cpl.placement(api_client, namespace, "fits")
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("waits", pool=pool, tflops="100", vram="100Gi"))
    cpl.wait_until(lambda: cpl.scheduling_failure(api_client, namespace, "waits"), 60,
                   what="the scheduler to give up on pod waits")

    out = _plugin(kubeconfig, "status", "--context", "e2e", "-n", namespace, "-o", "json")
    assert out.returncode == 0, out.stderr
    mine = next(p for p in json.loads(out.stdout)["pools"] if p["name"] == pool)
    assert mine["tflops"] == {"total": "100", "allocated": "30", "free": "70"}
    assert [p["pod"] for p in mine["pendingPods"]] == [f"{namespace}/waits"]

    elsewhere = _plugin(kubeconfig, "status", "--context", "e2e", "-n", "kube-system", "-o", "json")
    mine = next(p for p in json.loads(elsewhere.stdout)["pools"] if p["name"] == pool)
    assert mine["tflops"]["allocated"] == "30" and mine["pendingPods"] == []  # figures stay cluster-wide

    down = _plugin(kubeconfig, "status")  # the current context: nothing listens there
    assert down.returncode == 1 and len(down.stderr.strip().splitlines()) == 1, down.stderr
    assert down.stderr.startswith("kubectl tf status: error: cannot reach the API server at https://127.0.0.1:")
    assert "Traceback" not in down.stderr


def test_kubectl_tf_status_watch_prints_screens_until_interrupted(kubeconfig, gpu_cluster):
    proc = subprocess.Popen([str(cpl.console_script("kubectl-tf")), "status", "--context", "e2e", "--watch",
                             "--watch-interval", "500ms"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
                            # as from a terminal: a background job of a shell inherits SIGINT ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        screens = 0
        deadline = time.monotonic() + 120 * cpl.TIMEOUT_SCALE
        assert proc.stdout is not None
        while screens < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            screens += line.startswith("--- ")  # not a terminal: a stamp line between screens
            assert line or proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert screens == 2
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_kubectl_tf_snapshot_feeds_simulate_plan_and_mutate(
        kubeconfig, api_client, gpu_cluster, namespace, make_pool, make_gpu, make_node, extender, tmp_path):
    """One command takes what the offline tools read; each reads it as written, and sees the live cluster:
    a pod that fits where the scheduler placed its twin, and the pool's own SchedulingConfigTemplate."""
    pool = make_pool("CompactFirst")
    node = f"ks-{uuid.uuid4().hex[:6]}"
    make_gpu(f"{node}-gpu-0", node, pool=pool, index=0, **CAP)
    make_node(node)
    extender.wait_node_allocated(node, 0.0)
    cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("live", pool=pool, tflops="60", vram="20Gi"))
    cpl.placement(api_client, namespace, "live")

    snapshot = tmp_path / "snap.yaml"
    out = _plugin(kubeconfig, "snapshot", "--context", "e2e", "-f", str(snapshot))
    assert out.returncode == 0, out.stderr
    objects = [o for o in yaml.safe_load_all(snapshot.read_text()) if o]
    kinds = {o["kind"] for o in objects}
    assert {"Node", "GPU", "GPUPool", "SchedulingConfigTemplate", "Pod"} <= kinds, kinds
    assert all(o.get("apiVersion") and "managedFields" not in o["metadata"] for o in objects)
    assert any(o["kind"] == "Pod" and o["metadata"]["name"] == "live" for o in objects)

    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump_all([cpl.gpu_pod_body(name, pool=pool, tflops=t, vram="10Gi")
                                        for name, t in (("fits", "40"), ("too-big", "41"))]))
    sim = _plugin(kubeconfig, "simulate", "--cluster", str(snapshot), "--pods", str(pods),
                  "--fail-on-unplaced")
    assert sim.returncode == 3, sim  # the 60 TFLOPS already placed leave room for 40, not 41 more
    placed = [json.loads(line) for line in sim.stdout.splitlines()]
    assert [(p["pod"].split("/")[-1], p["node"]) for p in placed] == [("fits", node), ("too-big", None)]

    plan = _plugin(kubeconfig, "plan", "--cluster", str(snapshot), "-o", "table")
    assert plan.returncode == 0 and plan.stdout.startswith("ACTION"), plan

    mutated = _plugin(kubeconfig, "mutate", "--pod", str(pods), "--objects", str(snapshot))
    assert mutated.returncode == 2 and "found 2 documents" in mutated.stderr  # one object at a time
