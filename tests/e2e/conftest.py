"""Session fixtures for the end-to-end suite: a real etcd + kube-apiserver + kube-scheduler + kwok.

Fixtures (all session scoped unless noted):

- ``e2e_binaries``   {etcd, kube-apiserver, kube-scheduler, kwok, kwok-stages: Path}, built/cached by
                      tests/harness/build-control-plane.sh
- ``control_plane``  harness.ControlPlane, started, with the project's CRDs (manifests/crds) installed:
                      .server (https URL), .kubeconfig (admin, system:masters client cert), .server_ca /
                      .client_ca / .admin (CertPair), .client_cert(name, user, groups), .workdir, .log_dir,
                      .api_client(kubeconfig=None), .write_kubeconfig(path, user, cert),
                      .kubeconfig_for(user, groups), .kubeconfig_for_service_account(ns, name)
- ``api_client``     kubernetes.client.ApiClient for the admin kubeconfig
- ``karpenter_crds`` installs Karpenter's CRDs from the Karpenter module the suite builds; yields their names
- ``extender_port`` / ``extender_url``  loopback port and ``http://127.0.0.1:<port>/scheduler`` that the
                      kube-scheduler calls (nothing listens there until the extender fixture starts it)
- ``kube_scheduler`` kube-scheduler with manifests/scheduler/kube-scheduler-config.yaml, kubeconfig and
                      extender urlPrefix rewritten, leader election off; ManagedProcess (.port = secure port)
- ``kwok``           kwok managing Nodes annotated kwok.x-k8s.io/node=fake; ManagedProcess
- ``kube_controller_manager`` kube-controller-manager with the controllers the suite needs (ReplicaSet,
                      Deployment, Job, disruption, garbage collector, namespace); ManagedProcess
- ``cluster``        control_plane with kwok, kube_scheduler and kube_controller_manager running
- ``webhook``        ``tf-webhook serve`` on loopback with a serving certificate from
                      ``tf-certs generate``, the shipped MutatingWebhookConfiguration (clientConfig.url
                      pointed at it, caBundle set by ``tf-certs patch-webhook``), the shipped
                      PriorityClasses, the tensor-fusion-sys namespace and a default GPUPool
                      (``.default_pool``); a WebhookServer
- ``extender_runner`` ExtenderRunner owning the one ``tf-extender serve`` on ``extender_port``:
                      ensure(**flags) (re)starts it only when the flags differ, kill() (SIGKILL),
                      restart(), metric(name, **labels)
- ``extender``       (function) extender_runner.ensure() with the default flags
- ``gpu_cluster``    (function) cluster + webhook + extender: GPU pods go webhook -> scheduler -> extender
- ``make_pool``      (function) factory: make_pool(mode=None, name=None) -> GPUPool name (with a
                      SchedulingConfigTemplate of that placement mode), known to the webhook when it returns
- ``namespace``      (function) a fresh namespace; its pods are deleted at teardown
- ``make_node``      (function) factory: make_node(name=None, **node_body kwargs) -> name; deleted at teardown
- ``make_gpu``       (function) factory: make_gpu(name, node, **gpu_body kwargs) -> GPU object;
                      deleted at teardown

Environment: TF_CACHE_DIR (binary cache), TF_E2E_WORKDIR (keep the control plane's files, logs included,
in this directory instead of a pytest tmp dir; one subdirectory per pytest-xdist worker), TF_E2E_EXTENDER_PORT
(the extender's port; worker N of a parallel run takes that port + N).

In parallel (pytest-xdist, ``make test``) every worker is a session of its own: it runs whole test modules
(``--dist loadfile``) one after another on its own control plane, as a serial run does, with ports and
folders no other worker uses (``tests/harness/processes.py``). The order modules are handed out in is set in
``tests/conftest.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import harness as cpl

_ACTIVE: dict[str, cpl.ControlPlane] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end test against a real local control plane")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: ``-m "not e2e"`` must see the mark
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)


def pytest_terminal_summary(terminalreporter):
    """One line when the Cluster Autoscaler tests were skipped for want of a binary (e2e/autoscaler.py)."""
    from tests.harness.autoscaler import NOT_RUN

    skipped = terminalreporter.stats.get("skipped", [])
    if any(NOT_RUN in str(getattr(report, "longrepr", "")) for report in skipped):
        terminalreporter.write_line(NOT_RUN, yellow=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    cp = _ACTIVE.get("cp")
    if rep.failed and cp is not None:
        rep.sections.append(("control plane logs (" + str(cp.log_dir) + ")", cp.log_tails(40)))


def _install_cleanup() -> None:
    atexit.register(cpl.PROCESSES.stop_all)
    prev = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        cpl.PROCESSES.stop_all()
        if callable(prev):
            prev(signum, frame)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


_BINARIES: dict[str, Path] = {}


def pytest_collection_finish(session):
    """Build (first run, ~10 min on 2 cores) or find the cached binaries before any test starts, so the
    build does not count against a test's timeout. Only when e2e tests were selected."""
    here = Path(__file__).parent
    if session.config.option.collectonly or _BINARIES:
        return
    if not any(here in Path(str(i.fspath)).parents for i in session.items):
        return
    capman = session.config.pluginmanager.getplugin("capturemanager")
    ctx = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with ctx:
        _BINARIES.update(cpl.build_binaries())


@pytest.fixture(scope="session")
def e2e_binaries() -> dict[str, Path]:
    if not _BINARIES:
        _BINARIES.update(cpl.build_binaries())
    return dict(_BINARIES)


def _worker() -> tuple[str, int]:
    """This pytest-xdist worker's id and number ("gw3", 3), or ("", 0) in a serial run."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return name, int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


@pytest.fixture(scope="session")
def e2e_workdir(tmp_path_factory) -> Path:
    explicit = os.environ.get("TF_E2E_WORKDIR")
    if explicit:
        p = Path(explicit) / _worker()[0]
        p.mkdir(parents=True, exist_ok=True)
        return p
    return tmp_path_factory.mktemp("controlplane")


@pytest.fixture(scope="session")
def control_plane(e2e_binaries, e2e_workdir):
    _install_cleanup()
    cp = cpl.ControlPlane(e2e_workdir, e2e_binaries)
    _ACTIVE["cp"] = cp
    try:
        cp.start()
        cpl.apply_crds(cp.api_client(), cpl.project_crd_files())
        yield cp
    finally:
        # KeyboardInterrupt and failures included: every process we started goes, in reverse order
        cpl.PROCESSES.stop_all()
        _ACTIVE.pop("cp", None)


@pytest.fixture(scope="session")
def api_client(control_plane):
    c = control_plane.api_client()
    yield c
    c.close()


@pytest.fixture(scope="session")
def karpenter_crds(control_plane, api_client):
    return cpl.apply_crds(api_client, cpl.karpenter_crd_files())


@pytest.fixture(scope="session")
def extender_port() -> int:
    explicit = os.environ.get("TF_E2E_EXTENDER_PORT")
    return int(explicit) + _worker()[1] if explicit else cpl.free_port()


@pytest.fixture(scope="session")
def extender_url(extender_port) -> str:
    return f"http://127.0.0.1:{extender_port}/scheduler"


@pytest.fixture(scope="session")
def kube_scheduler(control_plane, e2e_binaries, extender_url):
    proc = cpl.start_scheduler(control_plane, e2e_binaries["kube-scheduler"], extender_url)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def kwok(control_plane, e2e_binaries):
    proc = cpl.start_kwok(control_plane, e2e_binaries["kwok"], e2e_binaries["kwok-stages"])
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def kube_controller_manager(control_plane, e2e_binaries):
    proc = cpl.start_controller_manager(control_plane, e2e_binaries["kube-controller-manager"])
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def cluster(control_plane, kwok, kube_scheduler, kube_controller_manager):
    return control_plane


@pytest.fixture
def namespace(api_client):
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    # pods first, at once (their GPUs are free for the next test); kube-controller-manager's namespace
    # controller removes the rest (Deployments, Jobs, PDBs ...) with the namespace
    with contextlib.suppress(Exception):  # best effort
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    with contextlib.suppress(Exception):  # best effort
        core.delete_namespace(name)


@pytest.fixture
def make_node(api_client):
    from kubernetes import client

    created: list[str] = []

    def factory(name: str | None = None, **kw) -> str:
        name = name or f"node-{uuid.uuid4().hex[:8]}"
        cpl.create_node(api_client, name, **kw)
        created.append(name)
        return name

    yield factory
    core = client.CoreV1Api(api_client)
    for name in created:
        with contextlib.suppress(Exception):  # best effort
            core.delete_node(name)


@pytest.fixture
def make_gpu(api_client):
    from kubernetes import client

    created: list[str] = []

    def factory(name: str, node: str, **kw) -> dict:
        obj = cpl.create_gpu(api_client, name, node, **kw)
        created.append(name)
        return obj

    yield factory
    custom = client.CustomObjectsApi(api_client)
    for name in created:
        with contextlib.suppress(Exception):  # best effort
            custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, "gpus", name)


# ------------------------------------------------------------------------------ webhook and extender


@pytest.fixture(scope="session")
def webhook(control_plane, api_client) -> cpl.WebhookServer:
    server = cpl.start_webhook(control_plane, api_client)
    yield server
    cpl.stop_webhook(control_plane, api_client, server)


@pytest.fixture(scope="session")
def extender_runner(control_plane, extender_port) -> cpl.ExtenderRunner:
    runner = cpl.ExtenderRunner(control_plane, extender_port)
    yield runner
    runner.stop()


@pytest.fixture
def extender(cluster, extender_runner) -> cpl.ExtenderRunner:
    extender_runner.ensure()
    return extender_runner


@pytest.fixture
def gpu_cluster(cluster, webhook, extender) -> cpl.ControlPlane:
    return cluster


@pytest.fixture
def make_pool(api_client, webhook):
    """make_pool(mode=None, name=None) -> the name of a new GPUPool; with ``mode``, the pool references a new
    SchedulingConfigTemplate of that placement mode. Returns once the webhook admits pods of the pool."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    created: list[tuple[str, str]] = []

    def factory(mode: str | None = None, name: str | None = None) -> str:
        name = name or f"pool-{uuid.uuid4().hex[:8]}"
        spec: dict[str, Any] = {}
        if mode:
            template = f"{name}-placement"
            cpl.create_cluster_object(api_client, "schedulingconfigtemplates", {
                "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "SchedulingConfigTemplate",
                "metadata": {"name": template}, "spec": {"placement": {"mode": mode}},
            })
            created.append(("schedulingconfigtemplates", template))
            spec["schedulingConfigTemplate"] = template
        cpl.create_cluster_object(api_client, "gpupools", {
            "apiVersion": f"{cpl.TF_GROUP}/{cpl.TF_VERSION}", "kind": "GPUPool",
            "metadata": {"name": name}, "spec": spec,
        })
        created.append(("gpupools", name))
        cpl.wait_for_webhook_pool(api_client, name)
        return name

    yield factory
    for plural, name in reversed(created):
        with contextlib.suppress(Exception):  # best effort
            custom.delete_cluster_custom_object(cpl.TF_GROUP, cpl.TF_VERSION, plural, name)
