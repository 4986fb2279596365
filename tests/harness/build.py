"""The control plane's binaries: built from the Go module proxy by ``build-control-plane.sh`` beside this
file, into a cache outside the repository (``TF_CACHE_DIR``, default ``~/.cache/tensor-fusion-extender``).

The script takes a lock in the cache, so workers of one run (or two runs) that ask at the same time build
once: the first builds, the others wait and find the cache.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent / "build-control-plane.sh"
# The Kubernetes version the control plane is built at (the script's K8S_VERSION default). `helm template` and
# `helm lint` render for it: helm's own default, v1.20, is below the chart's kubeVersion.
KUBE_VERSION: str = re.search(r'K8S_VERSION="\$\{K8S_VERSION:-(v[0-9.]+)\}"', BUILD_SCRIPT.read_text())[1]  # type: ignore[index]


def build_binaries(components: Iterable[str] = (), timeout: float = 3 * 3600) -> dict[str, Path]:
    """Run the build script (a no-op when cached) and return {component: binary path}."""
    env = dict(os.environ)
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT), *components],
        stdout=subprocess.PIPE,
        stderr=None,  # progress goes to the terminal / pytest's captured stderr
        text=True,
        env=env,
        timeout=timeout,
        check=True,
    )
    out: dict[str, Path] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export TF_BIN_"):
            key, _, value = line[len("export TF_BIN_") :].partition("=")
            out[key.lower().replace("_", "-")] = Path(value)
    return out
