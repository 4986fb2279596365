"""`make demo ONCE=1`: the demo places every sample pod where its placement mode says (the burst pool's on
nodes the real Karpenter launched for the expander), and exits 0."""

from __future__ import annotations

import subprocess
import sys

import pytest

from . import controlplane as cpl

pytestmark = pytest.mark.e2e


def test_demo_once_places_every_sample_pod_as_expected(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tests.e2e.demo", "--once", "--workdir", str(tmp_path)],
        cwd=cpl.REPO_ROOT, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "every sample pod was placed as expected" in result.stdout
    assert 'tensor-fusion.ai/tflops-request="lots"' in result.stdout  # the webhook's denial is shown
    assert "1200 TFLOPS exceeds the largest GPU here (989 TFLOPS)" in result.stdout  # the Pending reason
    # pool burst grew from zero through the real Karpenter: two nodes, both the expander's claims
    assert "Karpenter launched 2 NodeClaims in NodePool burst-a100, 2 of them created by the expander" \
        in result.stdout
