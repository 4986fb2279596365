"""The bind path under load: a backlog of 300 GPU pods, created while the extender is down, meets the
restarted extender while kube-apiserver and etcd are starved of CPU. Every pod ends bound once with its
GPUs, no GPU over capacity, and the scheduler fails at most 1 % of the attempts it makes after the
extender is back (no retry storm: a slow bind is waited for, a retried bind joins the one in flight).

Placements are checked from the pods as stored in the API server; failed attempts come from
kube-scheduler's own scheduler_schedule_attempts_total."""

from __future__ import annotations

import os
import re
import ssl
import time
import urllib.request

import pytest
from kubernetes import client

from tests import harness as cpl
from tests.harness.starve import starved

from .test_burst_e2e import PODS, _burst, _check_placements, make_exact_capacity

pytestmark = pytest.mark.e2e

STARVE_SECONDS = 240  # the longest the busy loops may run; they stop as soon as the backlog is placed
LOOP_NICENESS = int(os.environ.get("TF_E2E_STARVE_NICE", "0"))  # of the busy loops
MAX_FAILED_SHARE = 0.01


def failed_attempts(cp: cpl.ControlPlane, scheduler: cpl.ManagedProcess) -> float:
    """kube-scheduler's attempts that ended in an error or unschedulable, so far."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(cp.admin.cert), str(cp.admin.key))
    port = scheduler.port  # type: ignore[attr-defined]
    # generous: the scheduler authorizes the read against the (starved) API server
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=120, context=ctx) as r:
        page = r.read().decode()
    total = 0.0
    for line in page.splitlines():
        m = re.match(r'scheduler_schedule_attempts_total\{([^}]*)\}\s+(\S+)$', line)
        if m and re.search(r'result="(error|unschedulable)"', m.group(1)):
            total += float(m.group(2))
    return total


def scheduler_errors(scheduler: cpl.ManagedProcess, since: int) -> dict[str, int]:
    """The reasons kube-scheduler logged for failed attempts after byte ``since`` of its log, with counts
    (pod names left out): what a failure of this test is about."""
    with open(scheduler.log_path, "rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    reasons: dict[str, int] = {}
    for line in lines:
        m = re.search(r'"Error scheduling pod; retrying" err="(.*?)" logger', line)
        if m:
            reason = re.sub(r"\S+/burst-\d+", "<pod>", m.group(1))
            reasons[reason] = reasons.get(reason, 0) + 1
    return reasons


def test_a_backlog_meets_a_restarted_extender_on_a_starved_api_server(
        api_client, control_plane, kube_scheduler, gpu_cluster, extender_runner, namespace, make_pool,
        make_node, make_gpu):
    pool = make_pool()
    gpus = make_exact_capacity(pool, "backlog", make_node, make_gpu, extender_runner)
    core = client.CoreV1Api(api_client)

    extender_runner.kill()
    earlier = failed_attempts(control_plane, kube_scheduler)
    _burst(api_client, namespace, pool)
    # the scheduler has tried them: pods fail on the unreachable extender and wait in its backoff queue
    cpl.wait_until(lambda: failed_attempts(control_plane, kube_scheduler) >= earlier + PODS, 120, interval=1,
                   what=f"kube-scheduler to have tried the {PODS} pods against the dead extender")

    starved_pids = [p.pid for p in (control_plane.apiserver, control_plane.etcd) if p is not None]
    with starved(starved_pids, seconds=STARVE_SECONDS, loop_niceness=LOOP_NICENESS,
                 log_dir=control_plane.log_dir):
        started = time.monotonic()
        extender_runner.restart(timeout=180)  # its caches sync from the starved API server
        before = failed_attempts(control_plane, kube_scheduler)
        log_offset = kube_scheduler.log_path.stat().st_size
        ready_after = time.monotonic() - started

        def all_bound() -> bool:
            return sum(1 for p in core.list_namespaced_pod(namespace).items if p.spec.node_name) == PODS

        cpl.wait_until(all_bound, STARVE_SECONDS - ready_after - 10, interval=2,
                       what=f"all {PODS} pods placed on the starved control plane")
        placed_after = time.monotonic() - started
        failed = failed_attempts(control_plane, kube_scheduler) - before
    print(f"{PODS} pods placed {placed_after:.1f}s after the restart (extender ready after "
          f"{ready_after:.1f}s), {failed:.0f} failed scheduling attempts, "
          f"{extender_runner.metric('tf_extender_binds_total', outcome='success')} binds answered success")
    _check_placements(core, namespace, gpus)  # every pod bound once, with its GPU, none over capacity
    assert failed <= PODS * MAX_FAILED_SHARE, (
        f"{failed:.0f} failed scheduling attempts for {PODS} pods; kube-scheduler logged: "
        f"{scheduler_errors(kube_scheduler, log_offset)}")
