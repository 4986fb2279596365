"""``make release``: one version on every artifact, and the artifacts work.

``python -m tools.release`` (what ``make release VERSION=...`` runs) with a version no checkout carries and
``--skip-image`` (the image half is ``test_image_e2e.py``, which needs buildah): the wheel installs into a
scratch virtual environment where each console script prints that version, and the chart package carries
it as version and appVersion, so its objects run the image of that tag.

The scratch environment takes the wheel alone (``--no-deps``) and borrows the third-party packages of the
environment running the tests through a ``.pth`` line after its own site-packages: the project's code and
metadata come from the wheel, and the test stays well under a minute. That pip resolves and installs the
wheel's dependencies from the index is what the image build does (``test_image_e2e.py``).
"""

from __future__ import annotations

import subprocess
import sysconfig
import tarfile
import venv
from pathlib import Path

import pytest
import yaml

from tests import harness as cpl
from tools import release

pytestmark = pytest.mark.e2e

VERSION = "0.0.2.dev7"
CHART_VERSION = "0.0.2-dev7"  # Helm wants SemVer
SCRIPTS = ("tf-extender", "tf-webhook", "tf-certs", "kubectl-tf")


@pytest.fixture(scope="module")
def helm(e2e_binaries) -> Path:
    binary = e2e_binaries.get("helm")
    return binary if binary is not None and binary.exists() else cpl.build_binaries(["helm"])["helm"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory, helm) -> Path:
    out = tmp_path_factory.mktemp("dist")
    assert release.main(["--version", VERSION, "--dist", str(out), "--helm", str(helm), "--skip-image"]) == 0
    return out


def test_the_wheel_installs_and_every_console_script_prints_the_version(dist, tmp_path):
    wheels = list(dist.glob("*.whl"))
    assert [w.name for w in wheels] == [f"tensor_fusion_extender-{VERSION}-py3-none-any.whl"]
    scratch = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(scratch)
    python = scratch / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", wheels[0]], check=True,
                   timeout=600, capture_output=True)
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (Path(own) / "borrowed-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = subprocess.run([python, "-c", "import extender, importlib.metadata as m; "
                            "print(extender.__file__, m.version('tensor-fusion-extender'))"],
                           capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert where[0].startswith(own) and where[1] == VERSION  # the wheel's code, not the checkout's
    for script in SCRIPTS:
        out = subprocess.run([scratch / "bin" / script, "--version"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert (out.returncode, out.stdout) == (0, f"{script} {VERSION}\n"), out.stderr


def test_the_chart_package_is_stamped_with_the_version(dist, helm):
    package = dist / f"tensor-fusion-extender-{CHART_VERSION}.tgz"
    with tarfile.open(package) as tar:
        member = tar.extractfile("tensor-fusion-extender/Chart.yaml")
        assert member is not None
        chart = yaml.safe_load(member.read())
    assert (chart["version"], chart["appVersion"]) == (CHART_VERSION, VERSION)
    rendered = subprocess.run([helm, "template", "tfe", package, "--namespace", "tensor-fusion-sys",
                               "--kube-version", cpl.KUBE_VERSION],
                              capture_output=True, text=True, timeout=180, check=True).stdout
    images = {c["image"] for doc in yaml.safe_load_all(rendered) if doc and doc.get("kind") == "Deployment"
              for c in doc["spec"]["template"]["spec"]["containers"]}
    assert f"tensor-fusion-extender:{VERSION}" in images, images


def test_a_bad_version_is_refused_in_one_line(tmp_path, capsys):
    assert release.main(["--version", "one", "--dist", str(tmp_path), "--skip-image"]) == 1
    assert capsys.readouterr().err == ("release: VERSION='one' is not a release version such as 1.2.3, "
                                       "1.2.3rc1 or 1.2.3.dev4\n")


def test_the_sbom_and_the_checksums_come_with_the_artefacts(dist):
    import hashlib
    import json

    sbom = json.loads((dist / f"tensor-fusion-extender-{VERSION}.spdx.json").read_text())
    assert sbom["spdxVersion"] == "SPDX-2.3"
    names = {p["name"] for p in sbom["packages"]}
    assert {"tensor-fusion-extender", "aiohttp", "kubernetes", "tzdata"} <= names
    sums = dict(line.split("  ")[::-1] for line in (dist / "SHA256SUMS").read_text().splitlines())
    assert set(sums) == {f"tensor_fusion_extender-{VERSION}-py3-none-any.whl",
                         f"tensor-fusion-extender-{CHART_VERSION}.tgz",
                         f"tensor-fusion-extender-{VERSION}.spdx.json"}
    for name, digest in sums.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest
