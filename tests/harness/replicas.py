"""Two (or more) kube-scheduler + tf-extender replicas, as the chart runs them, each pair reaching the API
server through a TCP proxy of its own that a test can cut (a network partition of that replica).

Each pair is what one pod of the chart's Deployment runs: kube-scheduler with leader election on (its own
Lease, shared by the pairs of a test) calling the tf-extender beside it on loopback. Pods are canonical GPU
pods (annotations as the webhook writes them) of the test's own scheduler name, so no other scheduler of
the session takes them. ``kill()`` is a SIGKILL of both processes, ``stop()`` a SIGTERM (a rolling
update's old pod), ``proxy.cut()`` a partition. ``start_two`` starts a leading pair and a standby (with a
test's extender flags), ``when_both_lead`` times a takeover, ``Binds`` samples the bound pods.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .components import start_scheduler
from .controlplane import ControlPlane
from .manifests import scheduler_config
from .objects import GPU_IDS_ANNOTATION
from .processes import TIMEOUT_SCALE, ManagedProcess, console_script, free_port, http_ready, wait_until


class TcpProxy:
    """Forwards 127.0.0.1:<port> to the API server. ``cut()`` is a partition: bytes stop flowing both ways
    on open connections (nothing is closed, as when a network drops packets) and new connections are
    accepted and left silent. ``heal()`` drops the stalled connections (their clients reconnect)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = threading.Event()
        self.closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def cut(self) -> None:
        self.cut_off.set()

    def heal(self) -> None:
        with self._lock:
            stalled, self._sockets = self._sockets, []
        for s in stalled:
            with contextlib.suppress(OSError):
                s.close()
        self.cut_off.clear()

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        self.heal()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.extend(socks)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            self._track(downstream)
            if self.cut_off.is_set():
                continue  # accepted, never answered
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                downstream.close()
                continue
            self._track(upstream)
            threading.Thread(target=self._pump, args=(downstream, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self.closed.is_set():
                ready, _, _ = select.select(list(peers), [], [], 0.2)
                for src in ready:
                    data = src.recv(65536)
                    if not data:
                        return
                    while self.cut_off.is_set() and not self.closed.is_set():
                        time.sleep(0.05)  # held, as a dropped network holds it
                    peers[src].sendall(data)
        except (OSError, ValueError):  # closed by heal() or close()
            return
        finally:
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()


def proxied_kubeconfig(cp: ControlPlane, proxy: TcpProxy, path: Path, base: Path | None = None) -> Path:
    """A kubeconfig of the control plane (``base``, default the admin's) with the server replaced by the
    proxy (the serving certificate is for 127.0.0.1, so TLS is unchanged)."""
    cfg = yaml.safe_load((base or cp.kubeconfig).read_text())
    cfg["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


@dataclass
class Replica:
    """One pod of the chart: kube-scheduler and tf-extender, behind their own proxy."""

    name: str
    scheduler: ManagedProcess
    extender: ManagedProcess
    extender_port: int
    proxy: TcpProxy

    @property
    def processes(self) -> tuple[ManagedProcess, ManagedProcess]:
        return self.scheduler, self.extender

    def kill(self) -> None:
        """SIGKILL both containers: a node lost, an OOM kill."""
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.processes:
            proc.proc.wait(10)
            proc.stop()

    def stop(self) -> None:
        """SIGTERM, as a rolling update ends an old pod (both release their Leases)."""
        for proc in self.processes:
            proc.stop(timeout=20)

    def alive(self) -> bool:
        return all(p.alive() for p in self.processes)

    def extender_text(self, path: str) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.extender_port}{path}", timeout=5) as r:
            return str(r.read().decode())

    def extender_leads(self) -> bool:
        """From the extender's /metrics: tf_extender_leader is 1 on the replica holding the Leases."""
        for line in self.extender_text("/metrics").splitlines():
            if line.startswith("tf_extender_leader{"):
                return float(line.rsplit(None, 1)[1]) == 1.0
        return False

    def extender_identity(self) -> str:
        """The Lease holder name this replica's extender writes (the identity label of tf_extender_leader)."""
        for line in self.extender_text("/metrics").splitlines():
            if line.startswith('tf_extender_leader{identity="'):
                return line.split('"')[1]
        raise AssertionError("no tf_extender_leader sample")

    def extender_metric(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples with these labels on the extender's /metrics page."""
        from prometheus_client.parser import text_string_to_metric_families

        total = 0.0
        for family in text_string_to_metric_families(self.extender_text("/metrics")):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def scheduler_leads(self) -> bool:
        """kube-scheduler logs when it takes its Lease (its identity is the machine's host name, which all
        pairs here share, so the Lease alone cannot tell them apart)."""
        log = self.scheduler.log_path.read_text().lower()
        return self.scheduler.alive() and "successfully acquired lease" in log


@dataclass
class ReplicaSet:
    """The pairs of one test: one scheduler name, one scheduler Lease and one extender Lease namespace."""

    cp: ControlPlane
    scheduler_binary: Path
    namespace: str
    profile: str
    replicas: list[Replica] = field(default_factory=list)
    started: int = 0

    def start(self, timeout: float = 90, extra_args: Sequence[str] = ()) -> Replica:
        """One more pair; ``extra_args`` are added to its ``tf-extender serve`` command line (a test's
        capacity or expansion flags)."""
        self.started += 1
        name = f"{self.profile}-{self.started}"
        proxy = TcpProxy(self.cp.apiserver_port)
        kubeconfig = proxied_kubeconfig(self.cp, proxy, self.cp.workdir / f"{name}.kubeconfig")
        # the extender as its ServiceAccount, the one identity the shipped admission policy lets write GPU
        # allocations (a module before this one may have installed it on the session's control plane)
        extender_kubeconfig = proxied_kubeconfig(
            self.cp, proxy, self.cp.workdir / f"{name}-extender.kubeconfig", base=self.cp.extender_kubeconfig)
        port = free_port()
        extender = self.cp.registry.start(
            f"tf-extender-{name}",
            [console_script("tf-extender"), "serve", "--kubeconfig", extender_kubeconfig, "--port", port,
             "--bind-address", "127.0.0.1", "--expansion-lease-namespace", self.namespace,
             "--no-gpu-reservations", *extra_args],
            self.cp.log_dir)
        wait_until(lambda: http_ready(f"http://127.0.0.1:{port}/readyz", extender), timeout, interval=0.2,
                   what=f"tf-extender {name} /readyz")
        url = f"http://127.0.0.1:{port}/scheduler"
        cfg = scheduler_config(kubeconfig, url, leader_elect=True)
        cfg["profiles"][0]["schedulerName"] = self.profile
        cfg["leaderElection"].update(resourceName=self.profile, resourceNamespace=self.namespace)
        scheduler = start_scheduler(self.cp, self.scheduler_binary, url, name=f"kube-scheduler-{name}",
                                    config=cfg, timeout=timeout)
        replica = Replica(name, scheduler, extender, port, proxy)
        self.replicas.append(replica)
        return replica

    def leading(self) -> Replica | None:
        """The pair whose kube-scheduler leads."""
        return next((r for r in self.replicas if r.scheduler_leads()), None)

    def close(self) -> None:
        for replica in self.replicas:
            for proc in replica.processes:
                proc.stop(timeout=5)
                self.cp.registry.forget(proc)
            replica.proxy.close()


def start_two(pairs: ReplicaSet, extra_args: Sequence[str] = ()) -> tuple[Replica, Replica]:
    """The first pair leads (both its scheduler and its extender), the second stands by."""
    first = pairs.start(extra_args=extra_args)
    wait_until(first.scheduler_leads, 60, interval=0.5, what="the first scheduler to lead")
    wait_until(first.extender_leads, 60, interval=0.5, what="the first extender to lead")
    second = pairs.start(extra_args=extra_args)
    time.sleep(1)
    assert not second.scheduler_leads() and not second.extender_leads()
    return first, second


def when_both_lead(*replicas: Replica, timeout: float = 90,
                   meanwhile: Callable[[], object] = lambda: None) -> dict[str, float]:
    """When (monotonic) a scheduler and an extender of these replicas each first led, polled together (in a
    rolling update either of two may take over, and the two Leases need not go to the same pod);
    ``meanwhile`` runs before each poll (a test's own sampling of what happens until then)."""
    led: dict[str, float] = {}
    checks = {"scheduler": lambda: any(r.scheduler_leads() for r in replicas),
              "extender": lambda: any(r.extender_leads() for r in replicas)}
    deadline = time.monotonic() + timeout * TIMEOUT_SCALE
    while len(led) < len(checks):
        assert time.monotonic() < deadline, f"only {sorted(led)} of the standby led after {timeout} s"
        meanwhile()
        for what, check in checks.items():
            if what not in led and check():
                led[what] = time.monotonic()
        time.sleep(0.1)
    return led


class Binds:
    """Samples how many pods of a namespace are bound, every 0.1 s, so a gap can be measured."""

    def __init__(self, core: Any, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def count(self) -> int:
        return sum(1 for p in self.core.list_namespaced_pod(self.namespace).items if p.spec.node_name)

    def _run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(Exception):
                self.samples.append((time.monotonic(), self.count()))
            time.sleep(0.1)

    def bound_at(self, at: float) -> int:
        """How many were bound at the last sample up to ``at``."""
        return max((n for t, n in self.samples if t <= at), default=0)

    def first_bind_after(self, at: float, timeout: float = 120) -> float:
        """When (monotonic) the first sample after ``at`` shows more pods bound than at ``at``; waits."""
        before = self.bound_at(at)
        return float(wait_until(
            lambda: next((t for t, n in list(self.samples) if t > at and n > before), None), timeout,
            interval=0.1, what="a pod bound"))

    def wait(self, pods: int, timeout: float) -> None:
        wait_until(lambda: self.samples and self.samples[-1][1] >= pods, timeout, interval=0.5,
                   what=f"{pods} pods bound")

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


# ------------------------------------------------------------------------------ the cluster and its pods


def canonical_gpu_pod(name: str, scheduler_name: str, pool: str, tflops: str, vram: str, index: int,
                      gpus: int = 1) -> dict[str, Any]:
    """A GPU pod as the webhook leaves it (canonical annotations, an index resource), for ``scheduler_name``;
    it carries no opt-in label, so the webhook leaves it alone."""
    from extender.common import contract

    request = contract.parse_request({
        contract.TFLOPS_REQUEST: tflops, contract.TFLOPS_LIMIT: tflops, contract.VRAM_REQUEST: vram,
        contract.VRAM_LIMIT: vram, contract.GPU_COUNT: str(gpus), contract.GPU_POOL: pool})
    resource, quantity = contract.index_resource(index)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {contract.COMPONENT_LABEL: contract.COMPONENT_WORKER,
                                              contract.POOL_LABEL: pool},
                     "annotations": contract.render_annotations(request)},
        "spec": {
            "schedulerName": scheduler_name,
            "containers": [{"name": "main", "image": "busybox", "resources": {
                "requests": {"cpu": "10m", "memory": "16Mi", resource: str(quantity)},
                "limits": {resource: str(quantity)}}}],
            "tolerations": [{"key": contract.USED_BY_TAINT_KEY, "operator": "Equal",
                             "value": contract.USED_BY_TAINT_VALUE, "effect": "PreferNoSchedule"}],
            "terminationGracePeriodSeconds": 0,
        },
    }


def make_gpu_nodes(make_node: Any, make_gpu: Any, prefix: str, pool: str, nodes: int, gpus_per_node: int,
                   tflops: int, vram_gi: int) -> dict[str, str]:
    """``nodes`` kwok nodes of ``gpus_per_node`` GPUs in ``pool`` through the suite's factories (deleted at
    teardown); GPU name -> node."""
    gpus: dict[str, str] = {}
    for n in range(nodes):
        node = f"{prefix}-{n}"
        for i in range(gpus_per_node):
            make_gpu(f"{node}-gpu-{i}", node, pool=pool, index=i, tflops=str(tflops), vram=f"{vram_gi}Gi")
            gpus[f"{node}-gpu-{i}"] = node
        make_node(node)
    return gpus


def placement_problems(pods: list[Any], gpus: dict[str, str], gpu_tflops: float) -> list[str]:
    """What a user would call lost or broken: a pod not bound, bound without its GPUs or to GPUs of another
    node, a GPU holding more TFLOPS than it has."""
    from extender.common import contract

    problems: list[str] = []
    held: Counter[str] = Counter()
    for pod in pods:
        name, annotations = pod.metadata.name, pod.metadata.annotations or {}
        if not pod.spec.node_name:
            problems.append(f"{name}: not bound")
            continue
        ids = [g for g in (annotations.get(GPU_IDS_ANNOTATION) or "").split(",") if g]
        if not ids:
            problems.append(f"{name}: bound to {pod.spec.node_name} without {GPU_IDS_ANNOTATION}")
        for gpu in ids:
            if gpus.get(gpu) != pod.spec.node_name:
                problems.append(f"{name}: GPU {gpu} is not on its node {pod.spec.node_name}")
            held[gpu] += float(contract.parse_request(annotations).tflops_request or 0)
    problems += [f"GPU {gpu}: {tflops:g} TFLOPS allocated of {gpu_tflops:g}"
                 for gpu, tflops in held.items() if tflops > gpu_tflops + 1e-9]
    return problems
