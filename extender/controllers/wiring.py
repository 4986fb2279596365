"""What a controller package gets to build itself from (``Deps``), what it gives back (``Built``) and the
shape of a controller package (``ControllerPackage``), which ``registry.CONTROLLERS`` lists.

A controller package exports:

- ``NAME``: its key in ``Settings.controllers``;
- ``DEFAULT``: its settings when none are given (what a ``Settings()`` of tests and tools runs);
- ``add_arguments(parser)`` and ``from_args(args)``: its ``serve`` options and their parsed settings;
- ``build(deps, settings) -> Built | None``: its controllers and filter hooks, or ``None`` when switched off.

``serve`` parses every package's options, builds every package in the registry's order and runs what they
return; nothing else names a controller (docs/design.md, "Controllers").

This module imports no Kubernetes client: ``tf-extender``'s option parsing imports the packages.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from extender.controllers.runner import Controller

if TYPE_CHECKING:
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from extender.kube.aio import AsyncKube
    from extender.kube.events import EventRecorder
    from extender.kube.informer import Informers, WatchCache
    from extender.kube.pods import KubePodApi
    from extender.scheduling.pdb import PdbGuard
    from extender.scheduling.state import ClusterState
    from extender.server.hooks import FilterHook
    from extender.server.metrics import Metrics


@dataclass(frozen=True)
class CoreCaches:
    """The caches that feed the cluster state; the verbs answer only once all have synced."""

    nodes: WatchCache
    pods: WatchCache  # the pods labelled tensor-fusion.ai/component=worker
    gpupools: WatchCache
    templates: WatchCache
    gpus: WatchCache | None  # None: --inventory-source node-labels

    @property
    def all(self) -> tuple[WatchCache, ...]:
        return tuple(c for c in (self.nodes, self.pods, self.gpupools, self.templates, self.gpus)
                     if c is not None)


@dataclass(frozen=True)
class Deps:
    """The process's shared parts, for ``build``."""

    api_client: client.ApiClient
    kube: AsyncKube
    state: ClusterState
    informers: Informers  # every watch is made here (``informers.cache(...)``)
    core: CoreCaches
    recorder: EventRecorder
    metrics: Metrics  # the extender's registry is ``metrics.registry``
    pod_api: KubePodApi
    pdb: PdbGuard | None  # PodDisruptionBudgets, when preemption is on

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry


@dataclass
class Built:
    """What a package runs: its controllers (each run by the runner), its filter hooks, and sinks for the
    cluster state's "room appeared on these nodes"."""

    controllers: Sequence[Controller] = ()
    hooks: Sequence[FilterHook] = ()
    room_sinks: Sequence[Callable[[Iterable[str]], None]] = ()
    # the object that holds the controllers' state, for tests and tools that look inside (``service.parts``)
    part: Any = None


class ControllerPackage(Protocol):
    NAME: str
    DEFAULT: Any

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def from_args(self, args: argparse.Namespace) -> Any: ...

    def build(self, deps: Deps, settings: Any) -> Built | None: ...
