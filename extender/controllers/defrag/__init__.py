"""Defragmentation: settings and cron (``config``), the pure plan (``plan``, also behind
``tf-extender plan --defrag``), the port to the cluster (``port``), and the controllers (``controller``):
``defrag`` looks at the pools every tick and queues the runs that are due, ``defrag-runs`` runs them, both on
the leader only; while a run empties nodes, the filter keeps the pool's pods off them (``narrow``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from extender.controllers.defrag.config import DefragOptions, add_arguments, from_args

if TYPE_CHECKING:
    from extender.controllers.wiring import Built, Deps

NAME = "defrag"
DEFAULT = DefragOptions()
__all__ = ["DEFAULT", "NAME", "add_arguments", "build", "from_args"]


def build(deps: Deps, settings: DefragOptions) -> Built | None:
    """The defragmenter on the core caches: its two leader-only controllers and its filter hook."""
    if not settings.enabled:
        return None
    from extender.controllers.defrag.port import kube_defragmenter
    from extender.controllers.wiring import Built

    defragmenter = kube_defragmenter(deps.api_client, deps.core, deps.state, deps.recorder, deps.registry,
                                     replacement_timeout=settings.replacement_timeout,
                                     tick_seconds=settings.tick_seconds)
    return Built(controllers=(defragmenter.looker, defragmenter.mover), hooks=(defragmenter,),
                 part=defragmenter)
