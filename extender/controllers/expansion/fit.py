"""Fit of a request on GPUs that do not exist yet: the empty copy of a template node and the virtual
nodes of in-flight claims (pure). The per-GPU arithmetic is placement's (``fitting_slots``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from extender.common.contract import GPURequest
from extender.scheduling.inventory import GPUDevice
from extender.scheduling.placement import Fit, Slot, evaluate, fitting_slots, is_hard, share_on
from extender.scheduling.state import GPUView

MAX_PODS_UNBOUNDED = 1 << 30  # a new node's pod limit plays no part in whether its GPUs fit


def device_of(view: GPUView | GPUDevice) -> GPUDevice:
    """The device behind a state view; a copied node's GPUs are new, so they count as Running."""
    if isinstance(view, GPUDevice):
        return view
    return dataclasses.replace(view.device, phase="Running", used_by="", isolation_mode="soft")


def empty_copy(devices: Iterable[GPUDevice]) -> list[Slot]:
    return [Slot(device) for device in devices]


def choose(slots: Sequence[Slot], request: GPURequest) -> list[int] | None:
    """Positions of the GPUs the request would take (fullest first, so later pods still fit), or None."""
    fitting = {slot.name for slot in fitting_slots(slots, request)}
    positions = [i for i, slot in enumerate(slots) if slot.name in fitting]
    if len(positions) < request.gpu_count:
        return None
    positions.sort(key=lambda i: (slots[i].free_vram, slots[i].free_tflops, slots[i].name))
    return positions[: request.gpu_count]


def take(slots: list[Slot], positions: Iterable[int], request: GPURequest) -> None:
    """Count the request on the chosen GPUs (in place)."""
    for i in positions:
        slot = slots[i]
        tflops, vram = share_on(request, slot.device.capacity_tflops, slot.device.capacity_vram)
        whole = slot.whole_holders + (1 if request.takes_whole_gpu else 0)
        slots[i] = Slot(slot.device, slot.used_tflops + tflops, slot.used_vram + vram, whole,
                        slot.holders + 1)


def empty_copy_fits(devices: Iterable[GPUDevice], request: GPURequest) -> bool:
    """Whether an empty node with these GPUs takes the request; for a hard-topology pod (its
    ``require-gpu-topology``), only when its GPUs reach the allowed tier (docs/topology.md)."""
    slots = empty_copy(devices)
    if is_hard(request, None):
        return evaluate(slots, request, 0, MAX_PODS_UNBOUNDED).fit is Fit.FITS
    return choose(slots, request) is not None
