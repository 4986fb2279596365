"""The expansion package as the service builds it: its reconcilers (which run on the leader only), its
filter hook, its options, and caches from the one factory (the NodeClaim cache is the process's one)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from extender.controllers import expansion
from extender.controllers.expansion.config import ExpansionConfig
from extender.controllers.expansion.provisioner import AutoscalerConfig
from extender.controllers.expansion.reservations import ReservationKeeper
from extender.controllers.expansion.worker import Expander
from extender.kube.resources import NODECLAIMS
from tests.unit.fixtures.wiring import deps as make_deps


def test_the_default_is_what_the_service_settings_gave() -> None:
    assert expansion.DEFAULT.expansion == ExpansionConfig()
    assert expansion.DEFAULT.autoscaler == AutoscalerConfig()


def test_options_parse_to_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TF_EXPANSION_ENABLED", "TF_GPU_RESERVATIONS", "TF_NODE_PROVISIONER", "POD_NAMESPACE",
                 "TF_PLACEHOLDER_NAMESPACE", "TF_EXPANSION_DELAY_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    parser = argparse.ArgumentParser()
    expansion.add_arguments(parser)
    assert expansion.from_args(parser.parse_args([])) == expansion.DEFAULT
    settings = expansion.from_args(parser.parse_args(["--no-expansion", "--node-provisioner", "karpenter"]))
    assert not settings.expansion.enabled and settings.autoscaler.provisioner.value == "karpenter"


async def test_built_with_everything_on() -> None:
    deps = make_deps()
    built = expansion.build(deps, expansion.DEFAULT)
    assert built is not None
    assert [(c.name, c.leader_only) for c in built.controllers] == [
        ("expander-claims", False), ("expander", True), ("gpu-reservations", False)]
    expander = built.part
    assert isinstance(expander, Expander) and list(built.hooks) == [expander]
    assert expander.port.claims is deps.informers.cache(NODECLAIMS)  # type: ignore[attr-defined]
    caches = {c.name: c for c in deps.informers.caches()}
    assert {"nodeclaims", "nodepools", "placeholders", "gpu-reservations"} <= set(caches)
    assert caches["placeholders"].label_selector == "tensor-fusion.ai/placeholder=true"
    assert caches["placeholders"].namespace == caches["gpu-reservations"].namespace == "tensor-fusion-sys"
    # every controller waits for the caches that feed the ledger; each for its own as well
    claims, decisions, reservations = built.controllers
    assert set(deps.core.all) <= set(claims.caches) and caches["nodeclaims"] in claims.caches
    assert caches["placeholders"] in decisions.caches and caches["placeholders"] not in claims.caches
    assert caches["gpu-reservations"] in reservations.caches
    assert set(deps.core.all) <= set(reservations.caches)
    await deps.kube.close()


async def test_reservations_run_without_expansion_and_nothing_runs_with_both_off() -> None:
    deps = make_deps()
    only = dataclasses.replace(expansion.DEFAULT, expansion=ExpansionConfig(enabled=False))
    built = expansion.build(deps, only)
    assert built is not None and [c.name for c in built.controllers] == ["gpu-reservations"]
    assert isinstance(built.part, ReservationKeeper) and list(built.hooks) == []
    assert "nodeclaims" not in [c.name for c in deps.informers.caches()]
    await deps.kube.close()
    off: Any = dataclasses.replace(only, autoscaler=AutoscalerConfig(reservations=False))
    deps = make_deps()
    assert expansion.build(deps, off) is None
    await deps.kube.close()
