"""One object at a time: a malformed pool (or claim) is named once per change, with an event and a condition
naming the field and the value, and never stops the others."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.controllers.capacity.compactor import Compactor, CompactorMetrics
from extender.controllers.capacity.launcher import Launcher, LauncherMetrics
from extender.controllers.isolation import Isolation
from tests.unit.fixtures.capacity import NOW, FakePort, karpenter_pool, view_of
from tests.unit.fixtures.capacity import catalog_file as catalog_file  # the fixture


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def record(self, obj: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        self.events.append((obj["metadata"]["name"], reason, message))


def _pool(name: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def test_a_raising_object_is_skipped_reported_once_per_change_and_the_others_go_on() -> None:
    events = Events()
    isolation = Isolation("test", "GPUPool", events)

    def step(pool: dict[str, Any]) -> str:
        if pool["metadata"]["name"] == "b":
            raise TypeError("'int' object is not iterable")
        return pool["metadata"]["name"].upper()

    pools = [_pool("a"), _pool("b"), _pool("c")]
    assert [r for _, r in isolation.each(pools, step)] == ["A", "C"]
    assert [r for _, r in isolation.each(pools, step)] == ["A", "C"]  # the same again: not reported again
    assert [(e[0], e[1]) for e in events.events] == [("b", "InvalidGPUPool")]
    assert "GPUPool b: cannot be read: TypeError: 'int' object is not iterable" in events.events[0][2]
    isolation.each([_pool("a"), _pool("b", "2"), _pool("c")], step)  # b changed, still bad: reported
    assert len(events.events) == 2
    isolation.ok(_pool("b", "3"))
    assert isolation.invalid == {}


async def test_named_problems_get_a_condition_and_it_is_cleared_when_fixed() -> None:
    written: list[tuple[str, str | None]] = []

    async def condition(obj: Any, message: str | None) -> None:
        written.append((obj["metadata"]["name"], message))

    isolation = Isolation("test", "GPUPool", Events(), condition=condition)
    isolation.report(_pool("p"), "nodeCompaction.period: '99999999999999h' is longer than any duration")
    isolation.report(_pool("p"), "nodeCompaction.period: '99999999999999h' is longer than any duration")
    await isolation.flush()
    isolation.ok(_pool("p", "2"))
    await isolation.flush()
    await isolation.flush()
    assert written == [("p", "nodeCompaction.period: '99999999999999h' is longer than any duration"),
                       ("p", None)]


BAD_MANAGERS = [
    {"nodeCompaction": "10m"},
    {"nodeCompaction": {"period": "99999999999999h"}},
    {"nodeProvisioner": {"gpuTaints": 5}},
    {"provisioningMode": ["Karpenter"]},
]


def _bad(name: str, manager: dict[str, Any]) -> dict[str, Any]:
    pool = copy.deepcopy(karpenter_pool(minResources={"tflops": 150}))
    pool["metadata"]["name"] = name
    pool["spec"]["nodeManagerConfig"].update(manager)
    return pool


async def test_bad_pools_beside_a_good_one_the_good_one_launches_as_if_they_were_absent(
        catalog_file: str) -> None:
    bad = [_bad(f"bad-{i}", m) for i, m in enumerate(BAD_MANAGERS)]
    alone_port = FakePort(existing={"/kwoknodeclasses/default"})
    alone = Launcher(view_of(alone_port, [karpenter_pool(minResources={"tflops": 150})],
                             tmp_catalog=catalog_file), alone_port,
                     LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    expected = [(a.pool, a.action, a.details.get("count")) for a in await alone.reconcile(NOW)
                if a.action == "launch"]

    port = FakePort(existing={"/kwoknodeclasses/default"})
    view = view_of(port, [*bad, karpenter_pool(minResources={"tflops": 150})], tmp_catalog=catalog_file)
    launcher = Launcher(view, port, LauncherMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    actions = await launcher.reconcile(NOW)
    assert [(a.pool, a.action, a.details.get("count")) for a in actions if a.action == "launch"] == expected
    await launcher.reconcile(NOW)  # a second pass: the bad pools are not reported again
    invalid = [e for e in port.events if e[1] == "InvalidGPUPool"]
    assert sorted(e[0] for e in invalid) == [p["metadata"]["name"] for p in bad]
    messages = " ".join(e[2] for e in invalid)
    for needle in ("nodeManagerConfig.nodeCompaction='10m': expected an object",
                   "nodeCompaction.period: '99999999999999h' is longer than any duration",
                   "nodeProvisioner.gpuTaints=5: expected a list",
                   "nodeManagerConfig.provisioningMode=['Karpenter']"):
        assert needle in messages
    conditions = [c for c in port.calls if c[0] == "PATCH" and c[1] == "gpupools" and c[3] == "status"
                  and any(x.get("type") == "ConfigValid" for x in c[4]["status"]["conditions"])]
    assert sorted(c[2] for c in conditions) == [p["metadata"]["name"] for p in bad]


@pytest.mark.parametrize("manager", BAD_MANAGERS)
async def test_the_compactor_runs_beside_a_bad_pool(catalog_file: str, manager: dict[str, Any]) -> None:
    port = FakePort()
    view = view_of(port, [_bad("bad", manager), karpenter_pool()], tmp_catalog=catalog_file)
    compactor = Compactor(view, port, CompactorMetrics(CollectorRegistry()), 300.0)  # type: ignore[arg-type]
    await compactor.reconcile(NOW)
    assert compactor.last_run.get("kp") == NOW  # the good pool's compaction ran
    assert [e[0] for e in port.events if e[1] == "InvalidGPUPool"] == ["bad"]


async def test_a_claim_with_a_malformed_recorded_vendor_does_not_stop_the_provisioned_controllers(
        catalog_file: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shape that stopped the Provisioned controller for every pool: a GPUNodeClaim whose free-text
    computing-vendor annotation holds ``params: "x"``. Its pool still launches, registers and terminates."""
    from extender.common.labels import COMPUTING_VENDOR
    from tests.unit.fixtures.capacity import Provisioned

    world = Provisioned(tmp_path, monkeypatch, catalog_file)
    claim = await world.launched()
    name = claim["metadata"]["name"]
    bad = copy.deepcopy(claim)
    bad["metadata"]["name"] = "pp-forged"
    bad["metadata"]["annotations"] = {**bad["metadata"].get("annotations", {}),
                                      COMPUTING_VENDOR: '{"type":"aws","params":"x"}'}
    world.claims.objects["pp-forged"] = bad
    await world.capacity.registration.reconcile(NOW)
    await world.capacity.termination.reconcile(NOW)
    await world.capacity.launch.reconcile(NOW)
    # the good claim is still looked after: its VM is described by the registration pass
    assert any(c == ("describe", claim["status"]["instanceID"]) for c in world.provider.calls)
    assert name in world.claims.objects
