"""Where the tests find upstream schemas, without any folder outside the repository.

Karpenter's CRDs come from the Karpenter Go module at the version the e2e suite runs
(``tests/harness/build-control-plane.sh karpenter-crds``: a module download, cached beside the Karpenter
binary, no build). TensorFusion compatibility is checked against the project's own example objects in
``tests/compat/tensor-fusion/``.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

TESTS = Path(__file__).resolve().parent
BUILD_SCRIPT = TESTS / "harness" / "build-control-plane.sh"
TENSOR_FUSION_EXAMPLES = TESTS / "compat" / "tensor-fusion"


@functools.cache
def karpenter_crds_dir() -> Path:
    """The directory holding Karpenter's CRD files (NodePool, NodeClaim, NodeOverlay, KWOKNodeClass)."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "karpenter-crds"],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    for line in out.splitlines():
        if line.startswith("export TF_BIN_KARPENTER_CRDS="):
            return Path(line.partition("=")[2])
    raise RuntimeError(f"{BUILD_SCRIPT} did not name the Karpenter CRD directory")


def karpenter_crd(plural: str) -> Path:
    """One Karpenter CRD file, e.g. ``karpenter_crd("nodeclaims")``."""
    matches = sorted(karpenter_crds_dir().glob(f"*_{plural}.yaml"))
    if len(matches) != 1:
        raise FileNotFoundError(f"no single Karpenter CRD for {plural} in {karpenter_crds_dir()}")
    return matches[0]
