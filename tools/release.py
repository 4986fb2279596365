"""``make release VERSION=x.y.z``: the image, the Helm chart package and the wheel, all of one version,
under ``dist/``.

    python -m tools.release [--version X.Y.Z] [--helm PATH] [--base-image IMAGE] [--skip-image]

The version is ``pyproject.toml``'s unless ``--version`` is given; then the build runs on a staged copy of
the committed tree (``git ls-files``) whose ``pyproject.toml`` carries it, so every artifact, and every
command's ``--version``, says the same version. Written to ``dist/``:

- ``tensor_fusion_extender-X.Y.Z-py3-none-any.whl``: the four console scripts (``pipx install``);
- ``tensor-fusion-extender-X.Y.Z.tgz``: the chart, version and appVersion X.Y.Z (``helm install``; a
  pre-release's chart version is spelt as SemVer: 1.2.3rc1 -> 1.2.3-rc1);
- ``tensor-fusion-extender-X.Y.Z.oci.tar``: the image as an OCI archive (``skopeo copy`` or ``podman load``),
  also left in buildah's local storage as ``tensor-fusion-extender:X.Y.Z``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = Path("charts/tensor-fusion-extender")
IMAGE_NAME = "tensor-fusion-extender"
# A version every artifact can carry as it is: X.Y.Z, optionally a pre-release (1.2.3rc1) and/or a
# development release (1.2.3.dev4), spelt as PEP 440 normalises them (pip would rewrite other spellings) and
# valid as an image tag. Helm wants SemVer 2 for a chart's version: ``chart_version`` spells it so.
VERSION_RE = re.compile(r"^(\d+\.\d+\.\d+)((?:a|b|rc)\d+)?(?:\.(dev\d+))?$")
_PYPROJECT_VERSION = re.compile(r'^version = "[^"]*"$', re.MULTILINE)


class ReleaseError(RuntimeError):
    """A release step failed; the message says which and why."""


def project_version(root: Path = ROOT) -> str:
    with open(root / "pyproject.toml", "rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise ReleaseError(f"VERSION={version!r} is not a release version such as 1.2.3, 1.2.3rc1 or "
                           "1.2.3.dev4")
    return version


def chart_version(version: str) -> str:
    """The SemVer spelling of a release version, for the chart's ``version``: 1.2.3rc1 -> 1.2.3-rc1,
    1.2.3.dev4 -> 1.2.3-dev4, 1.2.3rc1.dev4 -> 1.2.3-rc1.dev4 (the chart's appVersion, the image tag it
    runs, stays the version as it is)."""
    match = VERSION_RE.match(check_version(version))
    assert match is not None
    core, pre, dev = match.groups()
    suffix = ".".join(part for part in (pre, dev) if part)
    return f"{core}-{suffix}" if suffix else core


def _run(argv: Sequence[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None,
         timeout: float = 3600) -> str:
    try:
        proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{argv[0]} is not installed: {exc}") from exc
    if proc.returncode != 0:
        raise ReleaseError(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def tracked_files(root: Path) -> list[Path]:
    """The committed tree's files (what a clone has); every file but the usual caches without git."""
    if (root / ".git").exists():
        out = _run(["git", "-C", root, "ls-files", "-z"])
        return [Path(p) for p in out.split("\0") if p and (root / p).is_file()]
    skip = {".git", ".venv", "dist", "build", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
    return [p.relative_to(root) for p in root.rglob("*")
            if p.is_file() and not skip.intersection(p.relative_to(root).parts)]


def stage(root: Path, version: str, dest: Path) -> Path:
    """A copy of the committed tree whose pyproject.toml says ``version``."""
    shutil.rmtree(dest, ignore_errors=True)
    for rel in tracked_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    pyproject = dest / "pyproject.toml"
    text, count = _PYPROJECT_VERSION.subn(f'version = "{version}"', pyproject.read_text(), count=1)
    if count != 1:
        raise ReleaseError("pyproject.toml has no `version = \"...\"` line to stamp")
    pyproject.write_text(text)
    return dest


def build_wheel(source: Path, dist: Path) -> Path:
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist, source])
    name = project_version(source).replace("-", "_")
    wheels = sorted(dist.glob(f"tensor_fusion_extender-{name}-*.whl"))
    if not wheels:
        raise ReleaseError(f"pip wheel wrote no tensor_fusion_extender-{name} wheel to {dist}")
    return wheels[-1]


def package_chart(helm: str, source: Path, version: str, dist: Path) -> Path:
    semver = chart_version(version)
    _run([helm, "package", source / CHART, "--version", semver, "--app-version", version,
          "--destination", dist])
    return dist / f"{IMAGE_NAME}-{semver}.tgz"


def container_env() -> dict[str, str]:
    """buildah on any file system and in a container: vfs storage, chroot isolation (unless set)."""
    return {**os.environ, "STORAGE_DRIVER": os.environ.get("STORAGE_DRIVER", "vfs"),
            "BUILDAH_ISOLATION": os.environ.get("BUILDAH_ISOLATION", "chroot")}


def build_image(source: Path, version: str, dist: Path | None, base_image: str | None = None,
                name: str = IMAGE_NAME) -> str:
    """``buildah bud`` of the Dockerfile (network host: pip reaches the package index); the image stays in
    buildah's storage as ``name:version`` and, with ``dist``, is also written there as an OCI archive."""
    tag = f"{name}:{version}"
    argv: list[str | Path] = ["buildah", "bud", "--network", "host", "--layers",
                              "--build-arg", f"VERSION={version}", "--tag", tag]
    if base_image:
        argv += ["--build-arg", f"BASE_IMAGE={base_image}"]
    _run([*argv, "--file", source / "Dockerfile", source], env=container_env())
    if dist is not None:
        archive = dist / f"{name.rsplit('/', 1)[-1]}-{version}.oci.tar"
        archive.unlink(missing_ok=True)
        _run(["buildah", "push", tag, f"oci-archive:{archive}:{tag}"], env=container_env())
    return tag


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=None, help="the release version (default: pyproject.toml's)")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder (default dist/)")
    parser.add_argument("--helm", default=shutil.which("helm") or "helm", help="helm binary")
    parser.add_argument("--base-image", default=None, help="the Dockerfile's BASE_IMAGE (default its own)")
    parser.add_argument("--skip-image", action="store_true", help="the wheel and the chart only")
    args = parser.parse_args(argv)
    try:
        version = check_version(args.version or project_version())
        dist = args.dist.resolve()
        dist.mkdir(parents=True, exist_ok=True)
        source = stage(ROOT, version, dist / f".stage-{version}")
        made = [build_wheel(source, dist), package_chart(args.helm, source, version, dist)]
        if not args.skip_image:
            build_image(source, version, dist, args.base_image)
            made.append(dist / f"{IMAGE_NAME}-{version}.oci.tar")
        shutil.rmtree(source, ignore_errors=True)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    for path in made:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
