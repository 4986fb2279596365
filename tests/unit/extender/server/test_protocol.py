"""The extender v1 wire messages, as kube-scheduler's Go types encode them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from extender.server import protocol as p

POD = {"metadata": {"name": "a", "namespace": "ml", "uid": "u"}}
NODE_A = {"metadata": {"name": "a", "labels": {"x": "1"}}, "status": {"capacity": {"cpu": "4"}}}
NODE_B = {"metadata": {"name": "b"}}


def test_names_mode_is_answered_with_names_and_go_field_names() -> None:
    args = p.ExtenderArgs.model_validate({"Pod": POD, "Nodes": None, "NodeNames": ["a", "b"]})
    assert not args.full_nodes and args.candidate_names() == ["a", "b"]
    wire = p.filter_result(args, ["b"], {"a": "busy"}, {}).wire()
    assert wire == {"Nodes": None, "NodeNames": ["b"], "FailedNodes": {"a": "busy"},
                    "FailedAndUnresolvableNodes": {}, "Error": ""}


def test_full_nodes_mode_echoes_the_fitting_node_objects_unchanged() -> None:
    body = {"Pod": POD, "Nodes": {"metadata": {}, "items": [NODE_A, NODE_B]}, "NodeNames": None}
    args = p.ExtenderArgs.model_validate(body)
    assert args.full_nodes and args.candidate_names() == ["a", "b"]
    wire = p.filter_result(args, ["a"], {}, {"b": "no GPUs"}).wire()
    assert wire["Nodes"]["items"] == [NODE_A]
    assert wire["NodeNames"] is None
    assert wire["FailedAndUnresolvableNodes"] == {"b": "no GPUs"}


def test_keys_are_matched_case_insensitively_like_go() -> None:
    args = p.ExtenderBindingArgs.model_validate(
        {"podName": "a", "podnamespace": "ml", "PODUID": "u", "node": "n1"})
    assert (args.pod_name, args.pod_namespace, args.pod_uid, args.node) == ("a", "ml", "u", "n1")


def test_missing_or_null_pod_is_rejected() -> None:
    with pytest.raises(ValidationError):
        p.ExtenderArgs.model_validate({"NodeNames": ["a"]})
    with pytest.raises(ValidationError):
        p.ExtenderArgs.model_validate({"Pod": None, "NodeNames": ["a"]})


def test_preemption_args_in_both_shapes_and_the_result() -> None:
    meta = p.ExtenderPreemptionArgs.model_validate({
        "Pod": POD, "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}, "n2": None}})
    assert meta.candidate_names() == ["n1", "n2"]
    full = p.ExtenderPreemptionArgs.model_validate({
        "Pod": POD, "NodeNameToVictims": {"n3": {"Pods": [POD], "NumPDBViolations": 1}}})
    assert full.candidate_names() == ["n3"]
    result = p.ExtenderPreemptionResult(node_to_meta_victims={
        "n1": p.MetaVictims(pods=[p.MetaPod(uid="v1")], num_pdb_violations=0)})
    assert result.wire() == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}}


def test_host_priority_and_binding_result_shapes() -> None:
    assert p.HostPriority(host="n1", score=10).wire() == {"Host": "n1", "Score": 10}
    assert p.ExtenderBindingResult().wire() == {"Error": ""}


@given(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=8), st.data())
def test_filter_result_keeps_only_and_all_fitting_nodes_in_both_modes(names: list[str], data: st.DataObject
                                                                      ) -> None:
    fits = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    items = [{"metadata": {"name": n}} for n in names]
    by_names = p.filter_result(p.ExtenderArgs.model_validate({"Pod": POD, "NodeNames": names}), fits, {}, {})
    by_nodes = p.filter_result(p.ExtenderArgs.model_validate({"Pod": POD, "Nodes": {"items": items}}),
                               fits, {}, {})
    assert by_names.node_names == fits
    assert by_nodes.nodes is not None
    assert {n["metadata"]["name"] for n in by_nodes.nodes.items or []} == set(fits)
    json.dumps(by_nodes.wire())


def test_host_priority_list_is_the_wire_form_of_host_priority() -> None:
    scores = [("n1", 10), ("n2", 0)]
    assert p.host_priority_list(scores) == [p.HostPriority(host=h, score=s).wire() for h, s in scores]
    assert p.host_priority_list(scores) == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}]



@given(st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=8), st.data())
def test_filter_answer_is_the_wire_form_of_the_filter_result(names: list[str], data: st.DataObject) -> None:
    fits = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    rest = [n for n in names if n not in fits]
    failed = {n: "busy" for n in rest[::2]}
    unresolvable = {n: "no GPUs" for n in rest[1::2]}
    error = data.draw(st.sampled_from(["", "pool is gone"]))
    items = [{"metadata": {"name": n}} for n in names]
    for body in ({"Pod": POD, "NodeNames": names}, {"Pod": POD, "Nodes": {"items": items}}):
        args = p.ExtenderArgs.model_validate(body)
        assert (p.filter_answer(args, fits, failed, unresolvable, error)
                == p.filter_result(args, fits, failed, unresolvable, error).wire())
    assert p.binding_answer("x") == p.ExtenderBindingResult(error="x").wire()
