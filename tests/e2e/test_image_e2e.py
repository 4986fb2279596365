"""The project's image, built from its Dockerfile with buildah and run with podman.

What stands in for what: the Dockerfile's base (build argument ``BASE_IMAGE``, the official
``python:3.11-slim`` by default) cannot be pulled here, so the image is built FROM a minimal Debian bookworm
bootstrapped with debootstrap (python3 3.11 with venv and pip, ``python`` on PATH), imported as a local image
(``tests/harness/image.py``; the root file system is cached under the binary cache). Everything after
``FROM`` is the shipped Dockerfile: pip installs the project and its dependencies from the package index,
the image's own build step runs every command's ``--version``.

Then the image runs (``buildah run``, chroot isolation: podman's runtime cannot start containers inside this
machine's own container; see ``ImageContainer``): each console script's ``--version`` (the version stamped
at build), and the extender image serving the local control plane's kube-scheduler: the session's extender
is stopped and the container listens on its port (host network), so the scheduler's extender
configuration points at the container; a GPU pod created through the API server is bound by it with a GPU.

Opt-in: the module is skipped, with the reason, where buildah, podman or debootstrap is missing (``make
test`` on a machine without them); ``.ci/run`` installs them and sets ``TF_IMAGE_TESTS=required``, which
turns the skip into a failure.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path

import pytest
import yaml

from tests import harness as cpl
from tests.harness import image
from tools import release

pytestmark = pytest.mark.e2e

VERSION = "0.0.1.dev29"  # a version no checkout carries: --version must print what the build stamped
IMAGE = "localhost/tensor-fusion-extender-e2e-multiarch"  # a manifest list
COMMANDS = ("tf-extender", "tf-webhook", "tf-certs", "kubectl-tf")



@pytest.fixture(scope="module", autouse=True)
def image_tools() -> None:
    """Skip (or, with TF_IMAGE_TESTS=required, fail) where the tools are missing: in a fixture, so a run
    that deselects the module (``-m "not e2e"``) neither skips nor fails on them."""
    missing = image.missing_tools()
    if missing:
        reason = f"image tests need {', '.join(missing)} (apt-get install buildah podman debootstrap)"
        if os.environ.get("TF_IMAGE_TESTS") == "required":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


@pytest.fixture(scope="module")
def built_image(image_tools, tmp_path_factory) -> str:
    """The image of the committed tree stamped with VERSION (as ``make release`` stages it), for both
    platforms, into one manifest list; each platform from its own stand-in base, the build stage on this
    machine's."""
    bases = {f"linux/{arch}": image.base_stand_in(arch) for arch in ("amd64", "arm64")}
    source = release.stage(release.ROOT, VERSION, tmp_path_factory.mktemp("image") / "source")
    return release.build_image(source, VERSION, None, name=IMAGE, base_images=bases,
                               builder=bases[f"linux/{image.native_arch()}"])


@pytest.fixture(scope="module")
def container(built_image):
    box = image.ImageContainer(built_image)
    yield box
    box.remove()


def test_the_image_carries_the_version_and_every_command_prints_it(built_image, container):
    inspected = json.loads(image.run(["buildah", "inspect", "--type", "image", built_image]).stdout)
    labels = inspected["OCIv1"]["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert inspected["OCIv1"]["config"]["User"] == "65532:65532"
    assert container.run(["id", "-u"]).stdout.strip() == "65532"
    for command in COMMANDS:
        out = container.run([command, "--version"])
        assert out.stdout.strip() == f"{command} {VERSION}", out.stderr


def _instances(built_image: str) -> dict[str, str]:
    """architecture -> image digest, from the manifest list."""
    listed = json.loads(image.run(["buildah", "manifest", "inspect", built_image]).stdout)
    return {m["platform"]["architecture"]: m["digest"] for m in listed["manifests"]}


ELF_MACHINE = {"amd64": 62, "arm64": 183}  # e_machine of x86-64 and AArch64


def test_the_manifest_list_has_amd64_and_arm64_each_with_its_own_binaries(built_image):
    instances = _instances(built_image)
    assert sorted(instances) == ["amd64", "arm64"]
    for arch, digest in instances.items():
        box = image.ImageContainer(f"{IMAGE}@{digest}")
        try:
            root = Path(image.run(["buildah", "mount", box.id]).stdout.strip())
            try:
                site = root / "opt/venv/lib/python3.11/site-packages"
                compiled = sorted(site.glob("numpy/_core/_multiarray_umath*.so"))
                assert compiled, f"{arch}: numpy's extension module"
                header = compiled[0].read_bytes()[:20]
                machine = int.from_bytes(header[18:20], "little")
                assert header[:4] == b"\x7fELF" and machine == ELF_MACHINE[arch], (arch, machine)
                # no pip or setuptools anywhere: the runtime needs neither
                found = [p for lib in ("usr/lib", "usr/local/lib", "opt/venv/lib")
                         for p in (root / lib).glob("python3*/**/*")
                         if p.name.split("-")[0] in ("pip", "setuptools", "pkg_resources")]
                assert not found, found[:5]
                assert not list((root / "opt/venv/bin").glob("pip*"))
                crds = sorted(p.name for p in (root / "opt/venv/share/tensor-fusion-extender/crds").iterdir())
                assert crds == sorted(p.name for p in cpl.CRDS_DIR.glob("tensor-fusion.ai_*.yaml"))
                assert "tensorfusion:x:65532:65532:" in (root / "etc/passwd").read_text()
            finally:
                image.run(["buildah", "umount", box.id], check=False)
        finally:
            box.remove()
        config = json.loads(image.run(["buildah", "inspect", "--type", "image", f"{IMAGE}@{digest}"]).stdout)
        assert config["OCIv1"]["architecture"] == arch and config["OCIv1"]["config"]["User"] == "65532:65532"


def test_the_runtime_has_no_pip_knows_legacy_zones_and_finds_its_crds(container):
    for module in ("pip", "setuptools"):
        out = container.run(["python", "-c", f"import {module}"], check=False)
        assert out.returncode != 0 and "ModuleNotFoundError" in out.stderr
    zone = container.run(["python", "-c", "import zoneinfo; print(zoneinfo.ZoneInfo('US/Central'))"])
    assert zone.stdout.strip() == "US/Central"  # tzdata, as TensorFusion's Go binary accepts it
    where = container.run(["python", "-c",
                           "from extender.crds_cmd import default_files; print(default_files())"])
    assert where.stdout.strip() == "/opt/venv/share/tensor-fusion-extender/crds"


def test_crds_apply_from_the_image_with_no_files_given(container, control_plane):
    """What the chart's pre-upgrade Job runs (crds.upgradeJob): the CRDs the image ships, against a cluster
    that has the project's CRDs: each is ours, so nothing is refused."""
    kubeconfig = _portable_kubeconfig(control_plane.kubeconfig,
                                      control_plane.workdir / f"image-crds-{uuid.uuid4().hex[:6]}")
    out = image.run(container.argv(["tf-extender", "crds", "apply", "--kubeconfig", "/config/kubeconfig"],
                                   volumes=[f"{kubeconfig.parent}:/config:ro"]), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("gpus.tensor-fusion.ai: ") for line in lines), lines
    assert not [line for line in lines if ": refuse" in line]


def _portable_kubeconfig(source: Path, folder: Path) -> Path:
    """The extender's kubeconfig with its certificates inline, readable by the image's non-root user (the
    harness's key files are the test user's, mode 0600)."""
    cfg = yaml.safe_load(source.read_text())
    for cluster in cfg["clusters"]:
        ca = Path(cluster["cluster"].pop("certificate-authority"))
        cluster["cluster"]["certificate-authority-data"] = base64.b64encode(ca.read_bytes()).decode()
    for user in cfg["users"]:
        for key in ("client-certificate", "client-key"):
            path = Path(user["user"].pop(key))
            user["user"][f"{key}-data"] = base64.b64encode(path.read_bytes()).decode()
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    out = folder / "kubeconfig"
    out.write_text(yaml.safe_dump(cfg))
    out.chmod(0o644)
    return out


def test_the_extender_image_serves_the_schedulers_extender_calls(
        container, control_plane, extender_runner, gpu_cluster, api_client, namespace, make_node, make_gpu,
        make_pool):
    extender_runner.stop()  # the scheduler's extender port is the container's now
    kubeconfig = _portable_kubeconfig(control_plane.extender_kubeconfig,
                                      control_plane.workdir / f"image-{uuid.uuid4().hex[:6]}")
    proc = control_plane.registry.start(
        "tf-extender-image",
        container.argv(["tf-extender", "serve", "--kubeconfig", "/config/kubeconfig",
                        "--port", str(extender_runner.port)], volumes=[f"{kubeconfig.parent}:/config:ro"]),
        control_plane.log_dir, env=image.storage_env())
    try:
        cpl.wait_until(lambda: cpl.http_ready(f"{extender_runner.url}/readyz", proc), 120, interval=0.5,
                       what="the extender container's /readyz")
        pool = make_pool()
        node = f"image-{uuid.uuid4().hex[:6]}"
        make_gpu(f"{node}-gpu-0", node, pool=pool, index=0, tflops="100", vram="100Gi")
        make_node(node)
        cpl.create_pod(api_client, namespace, cpl.gpu_pod_body("served", pool=pool, tflops="10", vram="10Gi"))
        assert cpl.placement(api_client, namespace, "served", timeout=90) == (node, [f"{node}-gpu-0"])
        assert extender_runner.proc is None  # nothing but the container listens on the extender port
    finally:
        proc.stop()
        control_plane.registry.forget(proc)
