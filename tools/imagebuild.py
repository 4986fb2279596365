"""The image's build steps (the Dockerfile runs them in its build stage), on the build machine's platform
whatever the target, so that an arm64 image builds on amd64 (and the reverse) with no emulation:

    python imagebuild.py wheels --lock requirements.lock --arch arm64 --out /wheels
    python imagebuild.py venv --wheels /wheels --arch arm64 --project /src --venv /opt/venv
    python imagebuild.py rootfs /rootfs
    python imagebuild.py check /rootfs/opt/venv tf-extender ...

``wheels``: every file of the lock downloaded and checked against its hash; pure-Python packages (wheels, or
sdists built here) serve any platform, and each package with compiled code is fetched again as the target's
wheel (``pip download --platform``). ``venv``: the project's wheel, and the runtime virtual environment
from the wheels, which has no pip and no setuptools: they (and wheel, the build backend) serve only the
build. ``rootfs``: the target's base file system, without pip,
setuptools and their bundled wheels, with the runtime user (65532) in /etc/passwd and /etc/group.
``check``: every console script prints its version, when the target runs here (native); says it skipped
otherwise.

Standard library only: it runs on the base image's own Python, before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

# Docker's TARGETARCH -> the machine name (uname -m) and manylinux's architecture
ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}
# glibc versions whose manylinux wheels run on the base (Debian 12: glibc 2.36)
GLIBC_MINORS = range(17, 37)
BUILD_ONLY = {"setuptools", "wheel"}  # the build backend: in the lock, not in the runtime environment
USER = "tensorfusion"
UID = 65532
_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")


def _run(argv: Sequence[str | Path]) -> None:
    print("+", " ".join(map(str, argv)), flush=True)
    subprocess.run([str(a) for a in argv], check=True)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_blocks(text: str) -> dict[str, str]:
    """name -> its block (the pin, its hashes, its comments) of a hashed lock."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        found = _NAME.match(line)
        if found:
            current = blocks.setdefault(normalise(found.group(1)), [])
        if current is not None:
            current.append(line)
    return {name: "\n".join(lines) + "\n" for name, lines in blocks.items()}


def wheel_name(path: Path) -> str:
    return normalise(path.name.split("-")[0])


def is_pure(path: Path) -> bool:
    return path.name.endswith("-none-any.whl")


def platform_flags(arch: str) -> list[str]:
    machine = ARCHES[arch]
    major, minor = sys.version_info[:2]
    tags = [f"manylinux_2_{m}_{machine}" for m in GLIBC_MINORS]
    tags += [f"manylinux2014_{machine}", f"linux_{machine}"]
    flags = [arg for tag in tags for arg in ("--platform", tag)]
    return [*flags, "--python-version", f"{major}.{minor}", "--implementation", "cp",
            "--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none", "--only-binary=:all:"]


def native_arch() -> str:
    machine = platform.machine()
    return next((arch for arch, name in ARCHES.items() if name == machine), machine)


def wheelhouse(pip: Path, lock: Path, arch: str, out: Path) -> list[Path]:
    """The lock's packages as wheels for ``arch``, every download checked against the lock's hashes."""
    native = out / "native"
    blocks = lock_blocks(lock.read_text())
    # the locked build backend first (hashes checked), so that sdists build with it and nothing unlocked
    backend_lock = out / "backend.lock"
    backend_lock.write_text("".join(blocks[name] for name in sorted(BUILD_ONLY)))
    _run([pip, "install", "--no-deps", "--require-hashes", "-r", backend_lock])
    _run([pip, "wheel", "--no-deps", "--require-hashes", "--no-build-isolation", "-r", lock, "-w", native])
    wheels = sorted(native.glob("*.whl"))
    if arch == native_arch():
        return wheels
    compiled = [w for w in wheels if not is_pure(w)]
    target_lock = out / "compiled.lock"
    target_lock.write_text("".join(blocks[wheel_name(w)] for w in compiled))
    target = out / arch
    _run([pip, "download", "--no-deps", "--require-hashes", "-r", target_lock, "-d", target,
          *platform_flags(arch)])
    fetched = {wheel_name(w) for w in target.glob("*.whl")}
    missing = sorted(wheel_name(w) for w in compiled if wheel_name(w) not in fetched)
    if missing:
        raise SystemExit(f"no {arch} wheel for {', '.join(missing)}")
    return [w for w in wheels if is_pure(w)] + sorted(target.glob("*.whl"))


def wheels(lock: Path, arch: str, out: Path) -> None:
    """``out/runtime``: the runtime packages' wheels for ``arch``; ``out/backend``: the build backend's, for
    this machine."""
    work = Path(tempfile.mkdtemp(prefix="imagebuild-"))
    tools = work / "tools"
    _run([sys.executable, "-m", "venv", tools])
    found = wheelhouse(tools / "bin" / "pip", lock, arch, work)
    for folder in ("runtime", "backend"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for wheel in found:
        if wheel_name(wheel) not in BUILD_ONLY:
            shutil.copy2(wheel, out / "runtime" / wheel.name)
    for wheel in (work / "native").glob("*.whl"):
        if wheel_name(wheel) in BUILD_ONLY:
            shutil.copy2(wheel, out / "backend" / wheel.name)
    shutil.rmtree(work, ignore_errors=True)


def make_venv(wheel_dir: Path, arch: str, project: Path, venv: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="imagebuild-"))
    tools = work / "tools"
    _run([sys.executable, "-m", "venv", tools])
    pip = tools / "bin" / "pip"
    _run([pip, "install", "--no-deps", "--no-index", *sorted((wheel_dir / "backend").glob("*.whl"))])
    own = work / "project"
    _run([pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", own, project])
    runtime = sorted((wheel_dir / "runtime").glob("*.whl")) + sorted(own.glob("*.whl"))
    # No pip in the runtime environment; the interpreter is the base's, at the same path on every platform.
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    staged = work / "site"
    _run([pip, "install", "--no-deps", "--no-index", "--target", staged, *platform_flags(arch), *runtime])
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    for entry in sorted(staged.iterdir()):
        if entry.name == "bin":
            for script in sorted(entry.iterdir()):
                if script.is_file():  # (a .py script's __pycache__ stays behind)
                    _place_script(script, venv / "bin" / script.name, venv / "bin" / "python")
        else:
            shutil.move(str(entry), site / entry.name)
    shutil.rmtree(work, ignore_errors=True)


def _place_script(script: Path, dest: Path, python: Path) -> None:
    """A console script, its interpreter line naming the runtime environment's Python (pip --target
    writes the build's)."""
    lines = script.read_bytes().split(b"\n", 1)
    if lines[0].startswith(b"#!"):
        lines[0] = b"#!" + str(python).encode()
    dest.write_bytes(b"\n".join(lines))
    dest.chmod(0o755)


def _pip_and_setuptools(root: Path) -> Iterable[Path]:
    names = re.compile(r"^(pip|setuptools|wheel|_distutils_hack|pkg_resources|distutils-precedence\.pth)"
                       r"(-[^/]*\.(dist-info|egg-info|whl))?$")
    for lib in ("usr/lib", "usr/local/lib"):
        for python in sorted((root / lib).glob("python3*")):
            for folder in (python, python / "site-packages", python / "dist-packages",
                           python / "ensurepip" / "_bundled"):
                if folder.is_dir():
                    yield from (p for p in sorted(folder.iterdir()) if names.match(p.name))
    for folder in (root / "usr/share/python-wheels",):
        if folder.is_dir():
            yield from (p for p in sorted(folder.iterdir()) if re.match(r"^(pip|setuptools|wheel)-", p.name))
    for bin_dir in ("usr/bin", "usr/local/bin"):
        yield from sorted((root / bin_dir).glob("pip*"))


def prepare_rootfs(root: Path) -> None:
    for path in _pip_and_setuptools(root):
        print(f"removing /{path.relative_to(root)}", flush=True)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    for name, line in (("passwd", f"{USER}:x:{UID}:{UID}::/nonexistent:/usr/sbin/nologin"),
                       ("group", f"{USER}:x:{UID}:")):
        path = root / "etc" / name
        text = path.read_text() if path.exists() else ""
        if not any(entry.split(":")[0] == USER for entry in text.splitlines()):
            path.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line + "\n")


def check(venv: Path, arch: str, scripts: Sequence[str]) -> None:
    if arch != native_arch():
        print(f"check skipped: the target ({arch}) does not run on this {native_arch()} machine", flush=True)
        return
    python = venv / "bin" / "python"
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}"}
    for script in scripts:
        print("+", script, "--version", flush=True)
        subprocess.run([str(python), str(venv / "bin" / script), "--version"], check=True, env=env)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="imagebuild", description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    fetch = actions.add_parser("wheels", help="the lock's wheels for --arch, hashes checked")
    fetch.add_argument("--lock", type=Path, required=True)
    fetch.add_argument("--arch", choices=sorted(ARCHES), default=native_arch())
    fetch.add_argument("--out", type=Path, required=True)
    venv = actions.add_parser("venv", help="the runtime virtual environment for --arch")
    venv.add_argument("--wheels", type=Path, required=True)
    venv.add_argument("--arch", choices=sorted(ARCHES), default=native_arch())
    venv.add_argument("--project", type=Path, required=True)
    venv.add_argument("--venv", type=Path, required=True)
    rootfs = actions.add_parser("rootfs", help="the base's file system without pip, with the runtime user")
    rootfs.add_argument("root", type=Path)
    checking = actions.add_parser("check", help="each console script's --version, where the target runs")
    checking.add_argument("venv", type=Path)
    checking.add_argument("scripts", nargs="+")
    checking.add_argument("--arch", choices=sorted(ARCHES), default=native_arch())
    args = parser.parse_args(argv)
    if args.action == "wheels":
        wheels(args.lock, args.arch, args.out)
    elif args.action == "venv":
        make_venv(args.wheels, args.arch, args.project, args.venv)
    elif args.action == "rootfs":
        prepare_rootfs(args.root)
    else:
        check(args.venv, args.arch, args.scripts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
