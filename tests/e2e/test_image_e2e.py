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
IMAGE = "localhost/tensor-fusion-extender-e2e"
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
    """The image of the committed tree stamped with VERSION (as ``make release`` stages it)."""
    base = image.base_stand_in()
    source = release.stage(release.ROOT, VERSION, tmp_path_factory.mktemp("image") / "source")
    return release.build_image(source, VERSION, None, base_image=base, name=IMAGE)


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
