"""The Helm chart on a control plane: helm itself, renders, and a release brought to life without kubelets.

There are no kubelets here, so Deployments and hook Jobs cannot run as pods. ``run_hook`` does what Helm's
hook would (its RBAC objects, then the Job's command as the Job's ServiceAccount); ``start_release`` runs the
installed Deployments' exact command lines as local processes, each with a token of the ServiceAccount the
chart gave it (so the chart's RBAC is what authorises them), the scheduler with the installed ConfigMap's
KubeSchedulerConfiguration. Two substitutions, because there is no Service network: the webhook serves on a
loopback port with a loopback certificate, and the installed MutatingWebhookConfiguration's clientConfig is
switched from the Service to that URL (its rules, selectors and policies stay as installed).
"""

from __future__ import annotations

import base64
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .build import KUBE_VERSION, build_binaries
from .components import start_kwok, start_scheduler
from .controlplane import PROJECT_NAMESPACE, ControlPlane
from .manifests import REPO_ROOT, scheduler_config
from .objects import (
    TF_GROUP,
    TF_VERSION,
    create_cluster_object,
    create_gpu,
    create_node,
    create_pod,
    gpu_pod_body,
    placement,
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

CHART = REPO_ROOT / "charts" / "tensor-fusion-extender"
NS = PROJECT_NAMESPACE
RELEASE = "tfe"
HOOK = "helm.sh/hook"
HELM_HOME = Path(tempfile.gettempdir()) / "tf-e2e-helm-home"  # helm's config and cache, not the user's


def helm_binary(e2e_binaries: dict[str, Path]) -> Path:
    binary = e2e_binaries.get("helm")
    if binary is None or not binary.exists():
        binary = build_binaries(["helm"])["helm"]
    return binary


def run(
    helm: Path, *args: str | Path, check: bool = True, kubeconfig: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """helm with its own HOME; ``template`` and ``lint`` render for the suite's Kubernetes version, as
    ``helm install`` does for its cluster."""
    argv = [str(helm), *map(str, args)]
    if argv[1] in ("template", "lint") and "--kube-version" not in argv:
        argv += ["--kube-version", KUBE_VERSION]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"HOME": str(HELM_HOME), "PATH": "/usr/bin:/bin"},
    )
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({out.returncode}):\n{out.stderr}\n{out.stdout}")
    return out


def render(helm: Path, *args: str, chart: Path = CHART, release: str = RELEASE) -> list[dict[str, Any]]:
    out = run(helm, "template", release, chart, "--namespace", NS, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def is_hook(obj: dict[str, Any]) -> bool:
    return HOOK in (obj["metadata"].get("annotations") or {})


def sa_kubeconfig(cp: ControlPlane, name: str) -> Path:
    """A kubeconfig with a token of ServiceAccount NS/name from the TokenRequest API (the ServiceAccount the
    chart created), so the chart's RBAC bindings decide what it may do. (A client certificate cannot carry
    system:serviceaccount:tensor-fusion-sys:tensor-fusion-scheduler: a CN has at most 64 characters.)"""
    from kubernetes import client

    core = client.CoreV1Api(cp.api_client())
    token = core.create_namespaced_service_account_token(
        name, NS, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    cfg = yaml.safe_load(cp.kubeconfig.read_text())
    cfg["users"] = [{"name": name, "user": {"token": token}}]
    cfg["contexts"][0]["context"]["user"] = name
    path = cp.workdir / f"sa-token-{name}.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


def apply_objects(cp: ControlPlane, objs: list[dict[str, Any]], manager: str) -> None:
    """Server-side apply, as ``kubectl apply --server-side`` (what Argo CD and Flux do with a render)."""
    from kubernetes.dynamic import DynamicClient

    api = cp.api_client()
    dyn = DynamicClient(api)
    for obj in objs:
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        res.server_side_apply(
            body=obj,
            name=obj["metadata"]["name"],
            namespace=obj["metadata"].get("namespace"),
            field_manager=manager,
            force_conflicts=True,
        )


def hook_objects(helm: Path, kubeconfig: Path, release: str = RELEASE) -> list[dict[str, Any]]:
    out = run(helm, "get", "hooks", release, "--namespace", NS, kubeconfig=kubeconfig).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def run_hook(cp: ControlPlane, hooks: list[dict[str, Any]], job_name: str = "tensor-fusion-certs") -> str:
    """What Helm's hook would do: its RBAC objects, then the Job's command as the Job's ServiceAccount."""
    apply_objects(cp, [o for o in hooks if o["kind"] != "Job"], "helm-hook")
    job = next(o for o in hooks if o["kind"] == "Job" and o["metadata"]["name"] == job_name)
    pod = job["spec"]["template"]["spec"]
    kubeconfig = sa_kubeconfig(cp, pod["serviceAccountName"])
    command = pod["containers"][0]["command"]

    def attempt() -> str:  # RBAC takes a moment to count after the bindings are created
        return run_console_script(command[0], *command[1:], "--kubeconfig", kubeconfig)

    return wait_until(attempt, 20, interval=0.5, what="the tf-certs hook to succeed")


def _local(
    cp: ControlPlane, started: list[ManagedProcess], name: str, command: list[str], extra: list[str]
) -> ManagedProcess:
    """The container's exact command line, as a local process, plus the overrides a laptop needs."""
    proc = cp.registry.start(name, [str(console_script(command[0])), *command[1:], *extra], cp.log_dir)
    started.append(proc)
    return proc


@dataclass
class Running:
    extender_port: int
    webhook_port: int


def start_release(
    cp: ControlPlane, started: list[ManagedProcess], installed: list[dict[str, Any]],
    e2e_binaries: dict[str, Path], prefix: str = "chart",
) -> Running:
    """The installed Deployments' processes, run locally (see the module's docstring), and kwok."""
    from kubernetes import client

    api = cp.api_client()
    core, admission = client.CoreV1Api(api), client.AdmissionregistrationV1Api(api)
    deploy = {o["metadata"]["name"]: o for o in installed if o["kind"] == "Deployment"}
    sched_pod = deploy["tensor-fusion-scheduler"]["spec"]["template"]["spec"]
    ext = next(c for c in sched_pod["containers"] if c["name"] == "extender")
    sa_kc = sa_kubeconfig(cp, sched_pod["serviceAccountName"])
    port = free_port()
    # every metrics listener gets a free port too: in a pod it is the pod's own, here all share loopback
    extender = _local(
        cp, started, f"{prefix}-extender", ext["command"],
        [f"--port={port}", f"--metrics-port={free_port()}", f"--kubeconfig={sa_kc}"],
    )
    wait_until(lambda: http_ready(f"http://127.0.0.1:{port}/readyz", extender), 60,
               what="the chart's extender")
    cm = core.read_namespaced_config_map("tensor-fusion-scheduler-config", NS)
    sched_cfg = cp.workdir / f"{prefix}-scheduler-config.yaml"
    sched_cfg.write_text(cm.data["kube-scheduler-config.yaml"])
    cfg = scheduler_config(sa_kc, f"http://127.0.0.1:{port}/scheduler", source=sched_cfg)
    started.append(start_scheduler(cp, e2e_binaries["kube-scheduler"], "", name=f"{prefix}-scheduler",
                                   config=cfg))
    started.append(start_kwok(cp, e2e_binaries["kwok"], e2e_binaries["kwok-stages"], name=f"{prefix}-kwok"))

    web_pod = deploy["tensor-fusion-webhook"]["spec"]["template"]["spec"]
    web = web_pod["containers"][0]
    cert_dir = cp.workdir / f"{prefix}-webhook-certs"  # loopback certificate: no Service network here
    run_console_script("tf-certs", "generate", "--out-dir", cert_dir, "--dns", "localhost",
                       "--ip", "127.0.0.1")
    web_port = free_port()
    web_kc = sa_kubeconfig(cp, web_pod["serviceAccountName"])
    webhook = _local(
        cp, started, f"{prefix}-webhook", web["command"],
        [f"--port={web_port}", f"--metrics-port={free_port()}", "--bind-address=127.0.0.1",
         f"--cert-dir={cert_dir}", f"--kubeconfig={web_kc}"],
    )
    wait_until(lambda: https_ready(f"https://127.0.0.1:{web_port}/readyz", cert_dir / "ca.crt", webhook), 60,
               what="the chart's webhook")
    admission.patch_mutating_webhook_configuration(
        "tensor-fusion-webhook",
        [{"op": "replace", "path": "/webhooks/0/clientConfig",
          "value": {"url": f"https://127.0.0.1:{web_port}/mutate",
                    "caBundle": base64.b64encode((cert_dir / "ca.crt").read_bytes()).decode()}}],
    )
    return Running(port, web_port)


def webhook_back_to_service(cp: ControlPlane, ca_pem: bytes | None = None) -> None:
    """The installed clientConfig again (the Service, not start_release's loopback URL), so that a
    ``helm upgrade``'s three-way merge sees what the chart rendered; the caBundle: ``ca_pem`` (the hook's
    CA), else the one there."""
    from kubernetes import client

    admission = client.AdmissionregistrationV1Api(cp.api_client())
    current = admission.read_mutating_webhook_configuration("tensor-fusion-webhook")
    bundle = base64.b64encode(ca_pem).decode() if ca_pem else current.webhooks[0].client_config.ca_bundle
    admission.patch_mutating_webhook_configuration(
        "tensor-fusion-webhook",
        [{"op": "replace", "path": "/webhooks/0/clientConfig",
          "value": {"service": {"name": "tensor-fusion-webhook", "namespace": NS, "path": "/mutate",
                                "port": 443},
                    "caBundle": bundle}}],
    )


def schedule_a_gpu_pod(cp: ControlPlane, namespace: str = "work") -> tuple[str, str]:
    """A GPUPool with one GPU on one node, and a GPU pod that names it: mutated by the release's webhook
    (sent to its scheduler) and placed through its extender. Answers (pool, node) once it is bound and the
    extender has written the GPU's status."""
    from kubernetes import client

    api = cp.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    pool = f"helm-{uuid.uuid4().hex[:6]}"
    create_cluster_object(api, "gpupools", {"apiVersion": f"{TF_GROUP}/{TF_VERSION}", "kind": "GPUPool",
                                            "metadata": {"name": pool}, "spec": {}})
    create_gpu(api, f"{pool}-gpu-0", f"{pool}-node", pool=pool, tflops="100", vram="40Gi")
    create_node(api, f"{pool}-node")
    wait_for_webhook_pool(api, pool, timeout=60)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    create_pod(api, namespace, gpu_pod_body("train", pool=pool, tflops="30", vram="10Gi"))
    node, gpus = placement(api, namespace, "train", timeout=90)
    assert (node, gpus) == (f"{pool}-node", [f"{pool}-gpu-0"])
    pod = core.read_namespaced_pod("train", namespace)
    assert pod.spec.scheduler_name == "tensor-fusion-scheduler"  # mutated by the chart's webhook
    wait_until(
        lambda: custom.get_cluster_custom_object(TF_GROUP, TF_VERSION, "gpus", f"{pool}-gpu-0")["status"][
            "available"] == {"tflops": "70", "vram": "30Gi"},
        30,
        what="the chart's extender (default --write-gpu-status, chart RBAC) to write GPU status",
    )
    return pool, node
