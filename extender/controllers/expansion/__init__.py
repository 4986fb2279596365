"""Capacity-only failures become nodes: detection (``detect``, ``fit``), the pure decision (``decide``,
``inflight``), Karpenter NodeClaims (``karpenter``, ``nodeclaim``), the Cluster Autoscaler's placeholder and
reservation pods (``placeholders``, ``placeholder_pods``, ``reservations``), settings (``config``,
``provisioner``), the port (``port``, ``placeholder_port``), the intake from the filter and the pod watch
(``intake``) and the reconciles (``worker``).

As a controller package (``wiring``): the expander's two reconciles, ``expander-claims`` on every replica and
``expander`` on the leader, when expansion is on; ``gpu-reservations`` on every replica when GPU reservations
are on (independently of expansion). This module imports no Kubernetes client (the option parsing imports it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from extender.controllers.expansion import config, provisioner
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.provisioner import AutoscalerConfig

if TYPE_CHECKING:
    from extender.controllers.runner import Controller
    from extender.controllers.wiring import Built, Deps
    from extender.server.hooks import FilterHook

NAME = "expansion"


@dataclass(frozen=True)
class ExpansionSettings:
    """The expander's settings and the Cluster Autoscaler side's (placeholders and GPU reservations)."""

    expansion: ExpansionConfig = field(default_factory=ExpansionConfig)
    autoscaler: AutoscalerConfig = field(default_factory=AutoscalerConfig)


DEFAULT = ExpansionSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser)
    provisioner.add_arguments(parser)


def from_args(args: argparse.Namespace) -> ExpansionSettings:
    return ExpansionSettings(expansion=config.from_args(args), autoscaler=provisioner.from_args(args))


def build(deps: Deps, settings: ExpansionSettings) -> Built | None:
    """The expander (its reconciles and its filter hook) when expansion is on, the GPU reservation keeper
    when reservations are on; ``part`` is the expander, else the keeper."""
    from extender.controllers.expansion.placeholder_port import PLACEHOLDER_SELECTOR, attach_placeholders
    from extender.controllers.expansion.port import ExpansionCaches, kube_expander
    from extender.controllers.expansion.reservations import RESERVATION_SELECTOR, ReservationKeeper
    from extender.controllers.wiring import Built
    from extender.kube import resources

    controllers: list[Controller] = []
    hooks: list[FilterHook] = []
    part: object = None
    autoscaler = settings.autoscaler
    if settings.expansion.enabled:
        caches = ExpansionCaches(
            nodes=deps.core.nodes, gpupools=deps.core.gpupools, gpu_pods=deps.core.pods,
            nodeclaims=deps.informers.cache(resources.NODECLAIMS, optional=True, name="nodeclaims"),
            nodepools=deps.informers.cache(resources.NODEPOOLS, optional=True, name="nodepools"))
        expander = kube_expander(settings.expansion, deps.api_client, deps.state, deps.recorder, caches,
                                 deps.registry, wait_for=deps.core.all)
        placeholders = deps.informers.cache(resources.PODS, namespace=autoscaler.namespace,
                                            label_selector=PLACEHOLDER_SELECTOR, name="placeholders")
        attach_placeholders(expander, autoscaler, deps.api_client, deps.core.pods, placeholders)
        controllers += expander.controllers
        hooks.append(expander)
        part = expander
    if autoscaler.reservations:
        reservation_pods = deps.informers.cache(resources.PODS, namespace=autoscaler.namespace,
                                                label_selector=RESERVATION_SELECTOR, name="gpu-reservations")
        keeper = ReservationKeeper(autoscaler, deps.api_client, deps.state, deps.core.nodes, reservation_pods,
                                   caches=deps.core.all, registry=deps.registry)
        controllers.append(keeper.controller)
        part = keeper if part is None else part
    if not controllers:
        return None
    return Built(controllers=controllers, hooks=hooks, part=part)
