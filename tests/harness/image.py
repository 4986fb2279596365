"""The project's container image, built with buildah and run with podman, for the image tests.

The Dockerfile's base is a build argument (``BASE_IMAGE``, by default the official ``python:3.11-slim``).
No registry is reachable here, so the tests build from a stand-in of that base: a minimal Debian bookworm
bootstrapped with ``debootstrap`` (python3 3.11, python3-venv for ``python -m venv`` and its pip, and a
``python`` on PATH as the official image has), imported as a local image, one per architecture (amd64 and
arm64: the arm64 one is unpacked without running anything of it). The bootstrapped root file system
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
TOOLS = ("buildah", "podman", "debootstrap", "dpkg-deb")
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


def native_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def rootfs_tarball(arch: str | None = None) -> Path:
    """The bootstrapped stand-in's root file system for ``arch`` (default this machine's) as a tarball,
    built once (under a lock: parallel test workers build it once). Another architecture's is bootstrapped
    without running anything of it: debootstrap's first stage (--foreign) unpacks the essential packages,
    the rest are unpacked with dpkg-deb, and no maintainer script runs (none is needed to run python3)."""
    arch = arch or native_arch()
    foreign = arch != native_arch()
    root = cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    suffix = f"-{arch}" if foreign else ""
    tarball = root / f"debian-{SUITE}-python3.11{suffix}-rootfs.tar"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        work = root / f"rootfs-{SUITE}{suffix}.partial"
        shutil.rmtree(work, ignore_errors=True)
        run(["debootstrap", *(["--foreign", f"--arch={arch}"] if foreign else []), "--variant=minbase",
             f"--include={','.join(PACKAGES)}", SUITE, work, MIRROR], timeout=1800)
        if foreign:
            for deb in sorted((work / "var/cache/apt/archives").glob("*.deb")):
                run(["dpkg-deb", "-x", deb, work], timeout=300)
            shutil.rmtree(work / "debootstrap", ignore_errors=True)
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


def base_stand_in(arch: str | None = None) -> str:
    """The stand-in base image for ``arch`` (default this machine's) in buildah's storage, imported from
    the cached tarball when missing, with the architecture in its configuration.

    It trusts what this machine trusts: the host's CA bundle replaces Debian's, and pip is told to use it,
    since here the package index is reached through a TLS-inspecting proxy whose CA only the host knows.
    """
    arch = arch or native_arch()
    name = BASE_STAND_IN if arch == native_arch() else f"{BASE_STAND_IN}-{arch}"
    tarball = rootfs_tarball(arch)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if image_exists(name):
            return name
        container = run(["buildah", "from", "--arch", arch, "scratch"]).stdout.strip()
        try:
            run(["buildah", "add", container, tarball, "/"], timeout=900)
            if HOST_CA_BUNDLE.is_file():
                run(["buildah", "copy", container, HOST_CA_BUNDLE, str(HOST_CA_BUNDLE)])
                run(["buildah", "config", "--env", f"PIP_CERT={HOST_CA_BUNDLE}",
                     "--env", f"SSL_CERT_FILE={HOST_CA_BUNDLE}", container])
            run(["buildah", "config", "--os", "linux", "--arch", arch, "--env", f"PATH={PATH}",
                 "--cmd", "python3", container])
            run(["buildah", "commit", "--rm", container, name], timeout=900)
        except Exception:
            run(["buildah", "rm", container], check=False)
            raise
    return name


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
