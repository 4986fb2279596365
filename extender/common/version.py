"""The installed release's version, as the build_info metrics report it."""

from __future__ import annotations

import importlib.metadata

DISTRIBUTION = "tensor-fusion-extender"


def package_version() -> str:
    """The installed distribution's version (what ``pip show tensor-fusion-extender`` says), else unknown."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
