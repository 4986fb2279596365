"""A real control plane for the benchmarks, from the end-to-end harness (tests/harness/).

One control plane (etcd + kube-apiserver, CRDs installed) is shared by the benchmarks of one run; each
benchmark starts the processes it measures (kwok, schedulers, extender, webhook) and stops them itself.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import REPO_ROOT, TMP_DIR, log

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests import harness as cpl

__all__ = ["BenchCluster", "cpl", "create_cluster_scoped", "ensure_namespace", "parallel"]

_cleanup_installed = False


def _install_cleanup() -> None:
    global _cleanup_installed
    if _cleanup_installed:
        return
    _cleanup_installed = True
    atexit.register(cpl.PROCESSES.stop_all)
    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        cpl.PROCESSES.stop_all()
        if callable(previous):
            previous(signum, frame)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


class BenchCluster:
    """etcd + kube-apiserver with the project's CRDs, binaries built (or cached) by the e2e script."""

    def __init__(self, workdir: Path | None = None, apiserver_args: list[str] | None = None) -> None:
        self.workdir = workdir or TMP_DIR / "controlplane"
        self.apiserver_args = list(apiserver_args or [])
        self.binaries: dict[str, Path] = {}
        self.cp: Any = None
        self.api: Any = None

    def start(self) -> BenchCluster:
        _install_cleanup()
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        log("control plane: building/caching binaries (tests/harness/build-control-plane.sh)")
        self.binaries = cpl.build_binaries()
        self.cp = cpl.ControlPlane(self.workdir, self.binaries, apiserver_args=self.apiserver_args)
        self.cp.start()
        self.api = self.cp.api_client()
        cpl.apply_crds(self.api, cpl.project_crd_files())
        log(f"control plane up at {self.cp.server}")
        return self

    @property
    def kubeconfig(self) -> Path:
        return Path(self.cp.kubeconfig)

    @property
    def log_dir(self) -> Path:
        return Path(self.cp.log_dir)

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()
            self.api = None
        cpl.PROCESSES.stop_all()
        # keep the logs for reading, drop etcd's data (a GB after the full e2e run)
        shutil.rmtree(self.workdir / "etcd-data", ignore_errors=True)

    def __enter__(self) -> BenchCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ensure_namespace(api: Any, name: str) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def create_cluster_scoped(api: Any, plural: str, body: dict[str, Any]) -> None:
    """Create a tensor-fusion.ai cluster-scoped object unless it exists."""
    from kubernetes.client.rest import ApiException

    try:
        cpl.create_cluster_object(api, plural, body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def parallel(fn: Any, items: list[Any], workers: int = 6) -> list[Any]:
    """Run ``fn`` over ``items`` on a few threads (object creation is API-latency bound)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
