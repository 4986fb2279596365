"""The project's container image, built with buildah and run with podman, for the image tests.

The Dockerfile's base is a build argument (``BASE_IMAGE``, by default the official ``python:3.11-slim``).
No registry is reachable here, so the tests build from a stand-in of that base: a minimal Debian bookworm
bootstrapped with ``debootstrap`` (python3 3.11, python3-venv for ``python -m venv`` and its pip, and a
``python`` on PATH as the official image has), imported as a local image. The bootstrapped root file system
is cached under the binary cache (``<TF_CACHE_DIR>/image/``), so only the first run pays for it (about two
minutes); the import into buildah's storage is redone when the storage lacks it.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

SUITE = "bookworm"  # Debian 12: python3 is 3.11, the official base's minor version
MIRROR = os.environ.get("TF_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_STAND_IN = f"localhost/tensor-fusion-extender-base:python3.11-{SUITE}"
TOOLS = ("buildah", "podman", "debootstrap")
PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def cache_dir() -> Path:
    return Path(os.environ.get("TF_CACHE_DIR") or Path.home() / ".cache" / "tensor-fusion-extender") / "image"


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def storage_env() -> dict[str, str]:
    """buildah's and podman's environment: the vfs driver, which works on any file system (overlay on
    overlay does not), unless the caller chose one."""
    return {**os.environ, "STORAGE_DRIVER": os.environ.get("STORAGE_DRIVER", "vfs"),
            "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}


def run(argv: Sequence[str | Path], timeout: float = 900, check: bool = True,
        input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=storage_env(), input=input)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def rootfs_tarball() -> Path:
    """The bootstrapped stand-in's root file system as a tarball, built once (under a lock: parallel test
    workers build it once)."""
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    tarball = root / f"debian-{SUITE}-python3.11-rootfs.tar"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        work = root / f"rootfs-{SUITE}.partial"
        shutil.rmtree(work, ignore_errors=True)
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, work, MIRROR],
            timeout=1800)
        (work / "usr/local/bin").mkdir(parents=True, exist_ok=True)
        (work / "usr/local/bin/python").symlink_to("/usr/bin/python3")  # the official image's `python`
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (work / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        partial = tarball.with_suffix(".tar.partial")
        run(["tar", "-C", work, "--numeric-owner", "--one-file-system", "-cf", partial, "."], timeout=600)
        partial.rename(tarball)
        shutil.rmtree(work, ignore_errors=True)
        return tarball


def image_exists(name: str) -> bool:
    return run(["buildah", "inspect", "--type", "image", name], check=False, timeout=120).returncode == 0


def base_stand_in() -> str:
    """The stand-in base image in buildah's storage (imported from the cached tarball when missing).

    It trusts what this machine trusts: the host's CA bundle replaces Debian's, and pip is told to use it,
    since here the package index is reached through a TLS-inspecting proxy whose CA only the host knows.
    """
    tarball = rootfs_tarball()
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_exists(BASE_STAND_IN):
            return BASE_STAND_IN
        rootfs = f"{BASE_STAND_IN}-rootfs"
        if not image_exists(rootfs):
            run(["podman", "import", "--change", f"ENV=PATH={PATH}", "--change", 'CMD=["python3"]', tarball,
                 rootfs], timeout=900)
        container = run(["buildah", "from", "--pull-never", rootfs]).stdout.strip()
        try:
            if HOST_CA_BUNDLE.is_file():
                run(["buildah", "copy", container, HOST_CA_BUNDLE, str(HOST_CA_BUNDLE)])
                run(["buildah", "config", "--env", f"PIP_CERT={HOST_CA_BUNDLE}",
                     "--env", f"SSL_CERT_FILE={HOST_CA_BUNDLE}", container])
            run(["buildah", "commit", "--rm", container, BASE_STAND_IN], timeout=900)
        except Exception:
            run(["buildah", "rm", container], check=False)
            raise
    return BASE_STAND_IN


class ImageContainer:
    """A working container of an image, whose commands run with ``buildah run`` (chroot isolation, the
    host's network): podman's OCI runtime cannot start containers inside this machine's own container
    (cgroups in hybrid mode, rlimits it may not raise), while buildah's chroot runs the same root file
    system with the image's user, environment and working directory, as its RUN steps do."""

    def __init__(self, image_name: str) -> None:
        self.image = image_name
        self.id = run(["buildah", "from", "--pull-never", image_name], timeout=900).stdout.strip()

    def argv(self, command: Sequence[str | Path], volumes: Sequence[str] = ()) -> list[str]:
        """The command line that runs ``command`` in the container (for a process the harness manages)."""
        mounts = [arg for volume in volumes for arg in ("--volume", volume)]
        return ["buildah", "run", "--isolation", "chroot", "--network", "host", *mounts, self.id, "--",
                *(str(a) for a in command)]

    def run(self, command: Sequence[str | Path], timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(self.argv(command), timeout=timeout, check=check)

    def remove(self) -> None:
        run(["buildah", "rm", self.id], check=False, timeout=300)
