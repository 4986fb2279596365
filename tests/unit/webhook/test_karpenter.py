"""karpenter.sh/do-not-disrupt on mutated pods: the mutation, the auto switch, and the flag over HTTP."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient

from extender.common.labels import DO_NOT_DISRUPT
from tests.unit.fixtures.webhook import ServerUnderTest, pod, post, review, static_view, tf, view
from webhook import cli
from webhook.karpenter import DoNotDisruptSwitch, Mode, serves_nodeclaims
from webhook.mutation import mutate
from webhook.server import WebhookService, create_server


def mutated(p: dict[str, Any], do_not_disrupt: bool) -> dict[str, Any]:
    result = mutate(p, view(), scheduler_name="s", index=1, do_not_disrupt=do_not_disrupt)
    assert result.denial is None
    assert jsonpatch.apply_patch(p, result.patch) == result.pod
    return dict(result.pod["metadata"]["annotations"])


@pytest.mark.parametrize(("own", "flag", "expected"), [
    (None, True, "true"),
    (None, False, None),
    ("false", True, "false"),  # the pod's own choice wins
    ("true", False, "true"),
])
def test_mutated_pods_get_do_not_disrupt_only_with_the_flag(own: str | None, flag: bool,
                                                             expected: str | None) -> None:
    extra = {DO_NOT_DISRUPT: own} if own is not None else {}
    p = pod({**tf(tflops_request="1"), **extra})
    assert mutated(p, flag).get(DO_NOT_DISRUPT) == expected


def test_pods_not_opted_in_never_get_it() -> None:
    p = pod(tf(tflops_request="1"))
    p["metadata"]["labels"] = {}
    result = mutate(p, view(), scheduler_name="s", index=1, do_not_disrupt=True)
    assert result.skipped and result.patch == []


@pytest.mark.parametrize(("discovery", "expected"), [
    ({"resources": [{"name": "nodepools"}, {"name": "nodeclaims"}]}, True),
    ({"resources": [{"name": "nodepools"}]}, False),
    ({"resources": None}, False),
    ("garbage", False),
    (None, False),
])
def test_discovery_lists_nodeclaims(discovery: Any, expected: bool) -> None:
    assert serves_nodeclaims(discovery) is expected


class FakeProbe:
    def __init__(self, *answers: bool | Exception | None) -> None:
        self.answers = list(answers)

    async def __call__(self) -> bool | None:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


async def test_auto_follows_the_probe_and_keeps_the_last_answer_on_errors() -> None:
    switch = DoNotDisruptSwitch(Mode.AUTO, FakeProbe(False, True, RuntimeError("API down"), None, False))
    seen = []
    for _ in range(5):
        await switch.refresh()
        seen.append(switch.enabled)
    assert seen == [False, True, True, True, False]


@pytest.mark.parametrize(("mode", "expected"), [(Mode.TRUE, True), (Mode.FALSE, False)])
async def test_fixed_modes_ignore_karpenter(mode: Mode, expected: bool) -> None:
    switch = DoNotDisruptSwitch(mode)
    await switch.refresh()
    assert switch.enabled is expected


def test_auto_needs_a_probe() -> None:
    with pytest.raises(ValueError, match="probe"):
        DoNotDisruptSwitch(Mode.AUTO)


def test_serve_flag_defaults_to_auto_and_rejects_other_values(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["serve", "--cert-dir", "d"]).karpenter_do_not_disrupt == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--cert-dir", "d", "--karpenter-do-not-disrupt", "yes"])
    assert "invalid choice" in capsys.readouterr().err


async def test_the_service_asks_the_switch_on_every_review(aiohttp_client: Any) -> None:
    state = {"on": False}
    service = WebhookService(static_view, lambda: True, scheduler_name="s",
                             do_not_disrupt=lambda: state["on"])
    client: TestClient[Any, Any] = await aiohttp_client(ServerUnderTest(lambda: create_server(service)))
    p = pod(tf(tflops_request="1"))
    found = []
    for on in (False, True):
        state["on"] = on
        _, body = await post(client, review(p))
        patch = json.loads(base64.b64decode(body["response"]["patch"]))
        found.append(jsonpatch.apply_patch(p, patch)["metadata"]["annotations"].get(DO_NOT_DISRUPT))
    assert found == [None, "true"]
