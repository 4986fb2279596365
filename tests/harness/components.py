"""The components that run against a ``ControlPlane``: kube-scheduler (with the project's configuration and
a loopback extender), kube-controller-manager, kwok, and the project's own ``tf-webhook`` and
``tf-extender`` started as a user starts them (console scripts, certificates from ``tf-certs``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .controlplane import PROJECT_NAMESPACE, ControlPlane
from .manifests import (
    ADMISSION_POLICY,
    MANIFESTS,
    create_or_replace,
    load_yaml_docs,
    scheduler_config,
    webhook_configuration,
)
from .objects import (
    DEFAULT_POOL_ANNOTATION,
    GPU_IDS_ANNOTATION,
    KWOK_NODE_ANNOTATION,
    TF_GROUP,
    TF_VERSION,
    create_cluster_object,
    placed_pod_body,
    wait_for_webhook_pool,
)
from .processes import (
    ManagedProcess,
    console_script,
    free_port,
    http_ready,
    https_ready,
    run_console_script,
    wait_until,
)

WEBHOOK_CONFIG_NAME = "tensor-fusion-webhook"


def _wait_serving(proc: ManagedProcess, port: int, path: str, timeout: float) -> ManagedProcess:
    """Until a component's self-signed HTTPS endpoint answers "ok"; records the port on the process."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE

    def ready() -> bool:
        proc.check_alive()
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", timeout=2, context=ctx) as r:
            return r.read().decode() == "ok"

    wait_until(ready, timeout, interval=0.5, what=f"{proc.name} {path}")
    proc.port = port  # type: ignore[attr-defined]
    return proc


def start_scheduler(
    cp: ControlPlane,
    binary: Path,
    extender_url: str,
    name: str = "kube-scheduler",
    config: dict | None = None,
    timeout: float = 60,
    flags: tuple[str, ...] = (),
) -> ManagedProcess:
    cfg = config or scheduler_config(cp.kubeconfig, extender_url)
    cfg_path = cp.workdir / f"{name}-config.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    port = free_port()
    proc = cp.registry.start(
        name,
        [
            binary,
            f"--config={cfg_path}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--authentication-kubeconfig={cp.kubeconfig}",
            f"--authorization-kubeconfig={cp.kubeconfig}",
            # no front proxy here: do not look up the requestheader CA in kube-system (log noise)
            "--authentication-skip-lookup=true",
            f"--client-ca-file={cp.client_ca.cert}",
            f"--cert-dir={cp.workdir / (name + '-certs')}",
            "--v=2",
            *flags,
        ],
        cp.log_dir,
    )
    return _wait_serving(proc, port, "/readyz", timeout)


# The controllers the suite needs: owners recreate evicted pods (ReplicaSet, Deployment, Job), PDB status
# (disruption) lets the Eviction API allow evictions, deleted owners take their pods along (garbage
# collector), deleted namespaces are emptied (namespace). Everything else (node lifecycle, service accounts,
# CSRs ...) stays off: there are no kubelets and pods need no tokens.
CONTROLLERS = ("replicaset-controller", "deployment-controller", "job-controller", "disruption-controller",
               "garbage-collector-controller", "namespace-controller")


def start_controller_manager(cp: ControlPlane, binary: Path, controllers: Iterable[str] = CONTROLLERS,
                             name: str = "kube-controller-manager", timeout: float = 90) -> ManagedProcess:
    """kube-controller-manager running ``controllers``, with a client certificate of its own
    (system:kube-controller-manager in system:masters: one identity for every controller)."""
    kubeconfig = cp.kubeconfig_for("system:kube-controller-manager", ["system:masters"],
                                   name="kube-controller-manager")
    port = free_port()
    proc = cp.registry.start(
        name,
        [
            binary,
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--authentication-skip-lookup=true",
            f"--client-ca-file={cp.client_ca.cert}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={cp.workdir / (name + '-certs')}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            # recreate and re-count quickly on a small test cluster
            "--concurrent-replicaset-syncs=5",
            "--concurrent-deployment-syncs=5",
            "--v=2",
        ],
        cp.log_dir,
    )
    return _wait_serving(proc, port, "/healthz", timeout)


def start_kwok(cp: ControlPlane, binary: Path, stages: Path, name: str = "kwok") -> ManagedProcess:
    """kwok managing the Nodes annotated kwok.x-k8s.io/node=fake, with the stages the build script wrote
    (node-initialize, node-heartbeat, pod-ready, pod-delete)."""
    key, value = KWOK_NODE_ANNOTATION
    port = free_port()
    proc = cp.registry.start(
        name,
        [
            binary,
            f"--kubeconfig={cp.kubeconfig}",
            f"--config={stages}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={key}={value}",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.1.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{port}",  # plain http (no --tls-cert-file): /healthz
        ],
        cp.log_dir,
        env={"HOME": str(cp.workdir)},  # keep kwok from reading ~/.kwok
    )

    def ready() -> bool:
        proc.check_alive()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return r.status == 200

    wait_until(ready, 60, interval=0.5, what="kwok /healthz")
    proc.port = port  # type: ignore[attr-defined]
    return proc


def install_admission_policies(api_client: Any, timeout: float = 60) -> None:
    """The shipped ValidatingAdmissionPolicies and their bindings, in force when this returns (a pod forging
    an allocation is refused by a server-side dry run)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    admission = client.AdmissionregistrationV1Api(api_client)
    for doc in load_yaml_docs(ADMISSION_POLICY):
        if doc["kind"] == "ValidatingAdmissionPolicy":
            create_or_replace(admission.create_validating_admission_policy,
                               admission.read_validating_admission_policy,
                               admission.replace_validating_admission_policy, doc)
        else:
            create_or_replace(admission.create_validating_admission_policy_binding,
                               admission.read_validating_admission_policy_binding,
                               admission.replace_validating_admission_policy_binding, doc)
    probe = placed_pod_body("policy-probe", "probe", ["probe-gpu"], "1", "1Gi")

    def refused() -> bool:
        try:
            client.CoreV1Api(api_client).create_namespaced_pod("default", probe, dry_run="All")
        except ApiException as exc:
            return exc.status in (400, 403, 422) and GPU_IDS_ANNOTATION in (exc.body or "")
        return False

    wait_until(refused, timeout, interval=0.3, what="the ValidatingAdmissionPolicies to be in force")


class WebhookServer:
    """``tf-webhook serve`` as a user runs it, registered with the API server."""

    def __init__(self, proc: ManagedProcess, port: int, cert_dir: Path, default_pool: str) -> None:
        self.proc = proc
        self.port = port
        self.cert_dir = cert_dir
        self.ca_file = cert_dir / "ca.crt"
        self.default_pool = default_pool

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def start_webhook(control_plane: ControlPlane, api_client: Any,
                  default_pool: str | None = "e2e-default-pool") -> WebhookServer:
    """``tf-webhook serve`` as a user runs it (certificates from ``tf-certs``), registered with the API
    server through the shipped MutatingWebhookConfiguration, plus the PriorityClasses it assigns and a
    default GPUPool (none when ``default_pool`` is None)."""
    from kubernetes import client

    cert_dir = control_plane.workdir / "webhook-certs"
    run_console_script(
        "tf-certs", "generate", "--out-dir", cert_dir, "--dns", "localhost", "--ip", "127.0.0.1"
    )
    port = free_port()
    proc = control_plane.registry.start(
        "tf-webhook",
        [console_script("tf-webhook"), "serve", "--port", str(port), "--bind-address", "127.0.0.1",
         "--cert-dir", str(cert_dir), "--kubeconfig", str(control_plane.kubeconfig),
         # the tests' pods live in namespaces of their own; where the grant applies is unit-tested
         # (tests/unit/webhook/test_mutation.py) and the chart's value rendered (test_helm_chart)
         "--qos-priority-namespaces", "*"],
        control_plane.log_dir,
    )
    wait_until(
        lambda: https_ready(f"https://127.0.0.1:{port}/readyz", cert_dir / "ca.crt", proc),
        60, interval=0.3, what="tf-webhook /readyz",
    )
    core = client.CoreV1Api(api_client)
    with contextlib.suppress(client.ApiException):  # 409: already there
        core.create_namespace({"metadata": {"name": PROJECT_NAMESPACE}})
    scheduling = client.SchedulingV1Api(api_client)
    for doc in load_yaml_docs(MANIFESTS / "priorityclasses.yaml"):
        with contextlib.suppress(client.ApiException):  # 409: already there (value is immutable)
            scheduling.create_priority_class(doc)
    admission = client.AdmissionregistrationV1Api(api_client)
    create_or_replace(
        admission.create_mutating_webhook_configuration,
        admission.read_mutating_webhook_configuration,
        admission.replace_mutating_webhook_configuration,
        webhook_configuration(f"https://127.0.0.1:{port}/mutate"),
    )
    run_console_script(
        "tf-certs", "patch-webhook", "--name", WEBHOOK_CONFIG_NAME, "--ca-file", cert_dir / "ca.crt",
        "--kubeconfig", control_plane.kubeconfig,
    )
    install_admission_policies(api_client)
    if default_pool is not None:
        with contextlib.suppress(client.ApiException):  # 409: already there
            create_cluster_object(api_client, "gpupools", {
                "apiVersion": f"{TF_GROUP}/{TF_VERSION}", "kind": "GPUPool",
                "metadata": {"name": default_pool, "annotations": {DEFAULT_POOL_ANNOTATION: "true"}},
                "spec": {},
            })
        wait_for_webhook_pool(api_client, default_pool)
    return WebhookServer(proc, port, cert_dir, default_pool)


def stop_webhook(control_plane: ControlPlane, api_client: Any, server: WebhookServer) -> None:
    """Unregister (so later pods are not refused by a webhook that is gone) and stop."""
    from kubernetes import client

    admission = client.AdmissionregistrationV1Api(api_client)
    with contextlib.suppress(Exception):
        admission.delete_mutating_webhook_configuration(WEBHOOK_CONFIG_NAME)
    server.proc.stop()
    control_plane.registry.forget(server.proc)


class ExtenderRunner:
    """The one ``tf-extender serve`` on the session's extender port (the port kube-scheduler calls).

    ``ensure(**flags)`` starts it, or restarts it when it runs with other flags; a flag ``expansion_delay=1``
    becomes ``--expansion-delay 1``, ``True`` a bare flag. Tests that need particular flags ask for them;
    the next test that wants the defaults gets a restart. ``kill()`` simulates a crash (SIGKILL),
    ``restart()`` starts it again with the same flags."""

    DEFAULT_FLAGS: dict[str, Any] = {"log_level": "debug"}

    def __init__(self, cp: ControlPlane, port: int) -> None:
        self.cp = cp
        self.port = port
        self.proc: ManagedProcess | None = None
        self.flags: dict[str, Any] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, flags: dict[str, Any]) -> list[str]:
        argv = [str(console_script("tf-extender")), "serve", "--kubeconfig", str(self.cp.extender_kubeconfig),
                "--port", str(self.port)]
        for key, value in flags.items():
            if value is False or value is None:
                continue
            argv.append("--" + key.replace("_", "-"))
            if value is not True:
                argv.append(str(value))
        return argv

    def ensure(self, **flags: Any) -> ManagedProcess:
        wanted = {**self.DEFAULT_FLAGS, **flags}
        if self.proc is not None and self.proc.alive() and wanted == self.flags:
            return self.proc
        self.stop()
        return self._start(wanted)

    def _start(self, flags: dict[str, Any], timeout: float = 60) -> ManagedProcess:
        self.starts += 1
        proc = self.cp.registry.start("tf-extender", self.argv(flags), self.cp.log_dir)
        self.proc, self.flags = proc, flags
        wait_until(lambda: http_ready(f"{self.url}/readyz", proc), timeout, interval=0.2,
                       what="tf-extender /readyz")
        return proc

    def kill(self) -> None:
        """SIGKILL, no shutdown: what a crash or an OOM kill looks like to the scheduler."""
        proc = self.proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.proc.wait(10)
        proc.stop()  # closes the log
        self.cp.registry.forget(proc)

    def restart(self, timeout: float = 60) -> ManagedProcess:
        flags = dict(self.flags or self.DEFAULT_FLAGS)
        self.stop()
        return self._start(flags, timeout)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.cp.registry.forget(self.proc)
        self.proc = None

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample on the extender's /metrics page, or None when absent."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            page = r.read().decode()
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(page):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None

    def wait_node_allocated(self, node: str, vram_percent: float, timeout: float = 30) -> None:
        """Until the extender's picture of ``node`` is its GPUs with ``vram_percent`` of their VRAM allocated:
        the GPU objects and the pods holding them have reached its caches."""
        wait_until(
            lambda: self.metric("tf_extender_node_allocated_ratio", node=node, resource="vram") is not None
            and abs(100 * self.metric("tf_extender_node_allocated_ratio", node=node, resource="vram")
                    - vram_percent) < 1e-6,
            timeout, what=f"the extender to see {node} at {vram_percent}% VRAM allocated",
        )
