"""The project's version, read from the installed distribution's metadata.

``pyproject.toml`` holds the one version; an installed wheel, an image and an editable checkout all carry it
in their metadata, and every command's ``--version`` prints it from here (``tf-certs``, which imports nothing
of ``extender``, reads the same metadata itself).
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "tensor-fusion-extender"
UNKNOWN = "0+unknown"  # run from a source tree that was never installed


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def version_line(prog: str) -> str:
    """What ``PROG --version`` prints: ``tf-extender 0.1.0``."""
    return f"{prog} {version()}"
