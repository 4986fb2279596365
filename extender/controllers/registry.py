"""The controllers of ``tf-extender serve``: one tuple of controller packages (``wiring.ControllerPackage``),
in the order they are built and started. Adding a controller is adding its package here; ``serve`` reads its
options, builds it and runs what it returns from this tuple alone."""

from __future__ import annotations

from extender.controllers import (
    autoscale,
    capacity,
    defrag,
    expansion,
    gang,
    gpunode,
    gpustatus,
    nudge,
    preemptor,
    quota,
    tfcluster,
)
from extender.controllers.wiring import ControllerPackage

CONTROLLERS: tuple[ControllerPackage, ...] = (
    gang,
    quota,
    preemptor,
    nudge,
    gpustatus,
    defrag,
    expansion,
    capacity,
    tfcluster,
    gpunode,
    autoscale,
)
