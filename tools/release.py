"""``make release VERSION=x.y.z``: the image, the Helm chart package and the wheel, all of one version,
under ``dist/``.

    python -m tools.release [--version X.Y.Z] [--helm PATH] [--base-image IMAGE] [--platform linux/ARCH]
                            [--skip-image] [--sign-key KEY | --no-sign]

The version is ``pyproject.toml``'s unless ``--version`` is given; then the build runs on a staged copy of
the committed tree (``git ls-files``) whose ``pyproject.toml`` carries it, so every artifact, and every
command's ``--version``, says the same version. Written to ``dist/``:

- ``tensor_fusion_extender-X.Y.Z-py3-none-any.whl``: the four console scripts (``pipx install`` of the
  file, or of the package index once it is published there);
- ``tensor-fusion-extender-X.Y.Z.tgz``: the chart, version and appVersion X.Y.Z (``helm install``; a
  pre-release's chart version is spelt as SemVer: 1.2.3rc1 -> 1.2.3-rc1);
- ``tensor-fusion-extender-X.Y.Z.oci.tar``: the image for linux/amd64 and linux/arm64, one manifest list,
  as an OCI archive (``skopeo copy --all``), also left in buildah's local storage as the manifest list
  ``tensor-fusion-extender:X.Y.Z``;
- ``tensor-fusion-extender-X.Y.Z.spdx.json``: the SBOM (syft's of the image where syft is installed, else
  the packages of requirements.lock), and ``SHA256SUMS`` of every artefact;
- with cosign installed, ``<artefact>.sig`` and ``.bundle`` beside each (``--sign-key`` or keyless).

docs/release.md says how to publish each.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHART = Path("charts/tensor-fusion-extender")
IMAGE_NAME = "tensor-fusion-extender"
PLATFORMS = ("linux/amd64", "linux/arm64")  # the image's platforms (Grace and Graviton system pools)
_LOCKED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
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
         timeout: float = 3600, check: bool = True) -> str:
    try:
        proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{argv[0]} is not installed: {exc}") from exc
    if proc.returncode != 0 and check:
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


def native_platform() -> str:
    machine = platform.machine()
    return "linux/" + {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def build_image(source: Path, version: str, dist: Path | None, base_image: str | None = None,
                name: str = IMAGE_NAME, platforms: Sequence[str] = (),
                base_images: dict[str, str] | None = None, builder: str | None = None) -> str:
    """``buildah bud`` of the Dockerfile once per platform (default: PLATFORMS) into the manifest list
    ``name:version`` (``--manifest``), network host (pip reaches the package index). The build stage runs
    on this machine's platform, so no platform needs emulation (Dockerfile). ``base_images``: a platform's
    own BASE_IMAGE (local images, one per platform; a registry's index needs none), ``builder``: the build
    stage's image. With ``dist``, the list and every image in it are also written there as an OCI archive."""
    tag = f"{name}:{version}"
    env = container_env()
    # an earlier build of this version: a manifest list, or a single image of an older build
    _run(["buildah", "manifest", "rm", tag], env=env, check=False)
    _run(["buildah", "rmi", tag], env=env, check=False)
    _run(["buildah", "manifest", "create", tag], env=env)
    for plat in platforms or PLATFORMS:
        argv: list[str | Path] = ["buildah", "bud", "--network", "host", "--layers", "--platform", plat,
                                  "--manifest", tag, "--build-arg", f"VERSION={version}",
                                  "--build-arg", f"BUILDPLATFORM={native_platform()}"]
        base = (base_images or {}).get(plat) or base_image
        if base:
            argv += ["--build-arg", f"BASE_IMAGE={base}"]
        if base_images:  # local images: never look them up in a registry
            argv += ["--pull-never", "--build-arg", f"BUILD_IMAGE={builder or base}"]
        elif builder:
            argv += ["--build-arg", f"BUILD_IMAGE={builder}"]
        _run([*argv, "--file", source / "Dockerfile", source], env=env)
    if dist is not None:
        archive = dist / f"{name.rsplit('/', 1)[-1]}-{version}.oci.tar"
        archive.unlink(missing_ok=True)
        _run(["buildah", "manifest", "push", "--all", tag, f"oci-archive:{archive}:{tag}"], env=env)
    return tag


def sbom(source: Path, version: str, dist: Path, archive: Path | None) -> Path:
    """An SPDX 2.3 JSON SBOM: syft's of the image archive where syft is installed, else the packages the
    image installs, from requirements.lock (name, version, the sha256 of every file the lock allows) and
    the project itself."""
    out = dist / f"{IMAGE_NAME}-{version}.spdx.json"
    syft = shutil.which("syft")
    if syft and archive is not None and archive.exists():
        out.write_text(_run([syft, f"oci-archive:{archive}", "-o", "spdx-json"]))
        return out
    out.write_text(json.dumps(spdx_from_lock((source / "requirements.lock").read_text(), version), indent=1))
    return out


def spdx_from_lock(lock: str, version: str) -> dict[str, Any]:
    packages = [{"SPDXID": "SPDXRef-Package-tensor-fusion-extender", "name": IMAGE_NAME,
                 "versionInfo": version, "downloadLocation": "NOASSERTION", "filesAnalyzed": False,
                 "primaryPackagePurpose": "CONTAINER"}]
    relationships = [{"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES",
                      "relatedSpdxElement": packages[0]["SPDXID"]}]
    text = lock.replace("\\\n", " ")
    for line in text.splitlines():
        found = _LOCKED.match(line)
        if not found:
            continue
        pkg, pin = found.group(1).lower(), found.group(2)
        if pkg in ("setuptools", "wheel"):  # the build backend, not in the image
            continue
        ident = "SPDXRef-Package-python-" + re.sub(r"[^A-Za-z0-9.-]", "-", pkg)
        packages.append({
            "SPDXID": ident, "name": pkg, "versionInfo": pin, "downloadLocation": "NOASSERTION",
            "filesAnalyzed": False, "primaryPackagePurpose": "LIBRARY",
            "externalRefs": [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl",
                              "referenceLocator": f"pkg:pypi/{pkg}@{pin}"}],
            "checksums": [{"algorithm": "SHA256", "checksumValue": h} for h in _HASH.findall(line)],
        })
        relationships.append({"spdxElementId": packages[0]["SPDXID"], "relationshipType": "CONTAINS",
                              "relatedSpdxElement": ident})
    return {"spdxVersion": "SPDX-2.3", "dataLicense": "CC0-1.0", "SPDXID": "SPDXRef-DOCUMENT",
            "name": f"{IMAGE_NAME}-{version}", "documentNamespace":
                f"https://spdx.org/spdxdocs/{IMAGE_NAME}-{version}",
            "creationInfo": {"creators": ["Tool: tensor-fusion-extender tools.release"],
                             "created": "1970-01-01T00:00:00Z"},
            "packages": packages, "relationships": relationships}


def checksums(dist: Path, files: Sequence[Path]) -> Path:
    out = dist / "SHA256SUMS"
    out.write_text("".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in files))
    return out


def sign(files: Sequence[Path], key: str | None) -> list[Path]:
    """``cosign sign-blob`` of each file (a .sig and a .bundle beside it) when cosign is installed: with
    ``key`` (a key file or KMS URI, COSIGN_KEY), else keyless (an OIDC login; Sigstore's transparency log).
    Images are signed where they are pushed (docs/release.md): cosign signs a registry's digest."""
    cosign = shutil.which("cosign")
    if cosign is None:
        print("release: cosign is not installed: the artefacts are not signed (docs/release.md)",
              file=sys.stderr)
        return []
    made = []
    for path in files:
        argv: list[str | Path] = [cosign, "sign-blob", "--yes", "--output-signature", f"{path}.sig",
                                  "--bundle", f"{path}.bundle"]
        if key:
            argv += ["--key", key]
        _run([*argv, path])
        made += [Path(f"{path}.sig"), Path(f"{path}.bundle")]
    return made


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default=None, help="the release version (default: pyproject.toml's)")
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder (default dist/)")
    parser.add_argument("--helm", default=shutil.which("helm") or "helm", help="helm binary")
    parser.add_argument("--base-image", default=None, help="the Dockerfile's BASE_IMAGE (default its own)")
    parser.add_argument("--platform", action="append", default=None,
                        help=f"an image platform (repeatable; default {', '.join(PLATFORMS)})")
    parser.add_argument("--skip-image", action="store_true", help="the wheel and the chart only")
    parser.add_argument("--sign-key", default=os.environ.get("COSIGN_KEY"),
                        help="cosign's key (file or KMS URI; default $COSIGN_KEY, else keyless)")
    parser.add_argument("--no-sign", action="store_true", help="do not sign, even where cosign is installed")
    args = parser.parse_args(argv)
    try:
        version = check_version(args.version or project_version())
        dist = args.dist.resolve()
        dist.mkdir(parents=True, exist_ok=True)
        source = stage(ROOT, version, dist / f".stage-{version}")
        made = [build_wheel(source, dist), package_chart(args.helm, source, version, dist)]
        archive = None
        if not args.skip_image:
            build_image(source, version, dist, args.base_image, platforms=args.platform or PLATFORMS)
            archive = dist / f"{IMAGE_NAME}-{version}.oci.tar"
            made.append(archive)
        made.append(sbom(source, version, dist, archive))
        made.append(checksums(dist, made))
        if not args.no_sign:
            made += sign(made, args.sign_key)
        shutil.rmtree(source, ignore_errors=True)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    for path in made:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
