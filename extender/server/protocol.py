"""The kube-scheduler extender v1 wire messages (k8s.io/kube-scheduler/extender/v1).

The Go types have no JSON tags, so the keys on the wire are the Go field names (``Pod``,
``NodeNames`` ...). Go decodes keys case-insensitively; so do these models. Pods and Nodes stay
plain API JSON dicts, checked here once for the shape the code reads (``extender.common.shape``: text where
Kubernetes has text, bounded depth), so a malformed one is a bad request, never an error deeper in. Optional
Go pointers and maps may arrive as ``null``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from extender.common.shape import object_problem

Obj = dict[str, Any]

MIN_SCORE = 0
MAX_SCORE = 10


class _Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _case_insensitive_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        wanted, spelled = _wire_keys(cls)
        if data.keys() <= spelled:
            return data  # Go's own spelling, as kube-scheduler sends it
        return {wanted.get(k.lower(), k) if isinstance(k, str) else k: v for k, v in data.items()}

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")


@functools.cache
def _wire_keys(model: type[BaseModel]) -> tuple[dict[str, str], frozenset[str]]:
    """A message's wire keys by their lower-case spelling, and the set of them."""
    keys = {(f.alias or name).lower(): f.alias or name for name, f in model.model_fields.items()}
    return keys, frozenset(keys.values())


class NodeList(_Wire):
    items: list[Obj] | None = Field(default=None, alias="items")
    api_version: str | None = Field(default=None, alias="apiVersion")
    kind: str | None = Field(default=None, alias="kind")
    metadata: Obj | None = Field(default=None, alias="metadata")

    @field_validator("items")
    @classmethod
    def _named_nodes(cls, items: list[Obj] | None) -> list[Obj] | None:
        # Only the names are read (a full Node list can hold thousands): each must be text.
        for i, node in enumerate(items or []):
            meta = node.get("metadata")
            if meta is not None and (not isinstance(meta, dict)
                                     or not isinstance(meta.get("name", ""), str)):
                raise ValueError(f"Nodes.items[{i}].metadata.name: expected a string")
        return items

    def node_names(self) -> list[str]:
        return [(node.get("metadata") or {}).get("name", "") for node in self.items or []]


def _readable_pod(pod: Obj) -> Obj:
    problem = object_problem(pod, "Pod")
    if problem is not None:
        raise ValueError(problem)
    return pod


PodObj = Annotated[Obj, AfterValidator(_readable_pod)]


class ExtenderArgs(_Wire):
    pod: PodObj = Field(alias="Pod")
    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")

    @property
    def full_nodes(self) -> bool:
        """The scheduler is not node-cache-capable: it sent (and wants back) Node objects."""
        return self.node_names is None and self.nodes is not None

    def candidate_names(self) -> list[str]:
        if self.node_names is not None:
            return list(self.node_names)
        return self.nodes.node_names() if self.nodes is not None else []


class ExtenderFilterResult(_Wire):
    nodes: NodeList | None = Field(default=None, alias="Nodes")
    node_names: list[str] | None = Field(default=None, alias="NodeNames")
    failed_nodes: dict[str, str] = Field(default_factory=dict, alias="FailedNodes")
    failed_and_unresolvable: dict[str, str] = Field(default_factory=dict, alias="FailedAndUnresolvableNodes")
    error: str = Field(default="", alias="Error")


class HostPriority(_Wire):
    host: str = Field(alias="Host")
    score: int = Field(alias="Score")


def host_priority_list(scores: Iterable[tuple[str, int]]) -> list[dict[str, Any]]:
    """The HostPriorityList wire form of ``scores``, built directly: a model per node would cost
    about 25 ms for 5,000 nodes."""
    return [{"Host": host, "Score": score} for host, score in scores]


class ExtenderBindingArgs(_Wire):
    pod_name: str = Field(alias="PodName")
    pod_namespace: str = Field(alias="PodNamespace")
    pod_uid: str = Field(default="", alias="PodUID")
    node: str = Field(alias="Node")


class ExtenderBindingResult(_Wire):
    error: str = Field(default="", alias="Error")


class MetaPod(_Wire):
    uid: str = Field(alias="UID")


class MetaVictims(_Wire):
    pods: list[MetaPod] | None = Field(default=None, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class Victims(_Wire):
    pods: list[Obj] | None = Field(default=None, alias="Pods")
    num_pdb_violations: int = Field(default=0, alias="NumPDBViolations")


class ExtenderPreemptionArgs(_Wire):
    pod: PodObj = Field(alias="Pod")
    node_to_victims: dict[str, Victims | None] | None = Field(default=None, alias="NodeNameToVictims")
    node_to_meta_victims: dict[str, MetaVictims | None] | None = Field(
        default=None, alias="NodeNameToMetaVictims")

    def candidate_names(self) -> list[str]:
        names = dict.fromkeys(self.node_to_meta_victims or {})
        names.update(dict.fromkeys(self.node_to_victims or {}))
        return list(names)


class ExtenderPreemptionResult(_Wire):
    node_to_meta_victims: dict[str, MetaVictims] = Field(default_factory=dict, alias="NodeNameToMetaVictims")
    # Not a Go field: kube-scheduler ignores it, but it tells a human why the answer is empty.
    error: str | None = Field(default=None, alias="Error")

    def wire(self) -> dict[str, Any]:
        out = super().wire()
        if out.get("Error") is None:
            out.pop("Error", None)
        return out


def filter_result(args: ExtenderArgs, fits: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> ExtenderFilterResult:
    """Answer in the mode the scheduler asked in: names for names, Node objects for Node objects."""
    if args.full_nodes:
        assert args.nodes is not None
        keep = set(fits)
        items = [n for n in args.nodes.items or [] if (n.get("metadata") or {}).get("name") in keep]
        return ExtenderFilterResult(
            nodes=NodeList(items=items, api_version="v1", kind="NodeList", metadata={}),
            failed_nodes=failed, failed_and_unresolvable=unresolvable, error=error)
    return ExtenderFilterResult(node_names=list(fits), failed_nodes=failed,
                                failed_and_unresolvable=unresolvable, error=error)


def filter_error(message: str) -> ExtenderFilterResult:
    return ExtenderFilterResult(error=message)


def filter_answer(args: ExtenderArgs, fits: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> dict[str, Any]:
    """``filter_result(...).wire()``, built directly in names mode (the shipped, node-cache-capable one):
    the model and its dump cost as much as the rest of a filter's answer."""
    if args.full_nodes:
        return filter_result(args, fits, failed, unresolvable, error).wire()
    return {"Nodes": None, "NodeNames": list(fits), "FailedNodes": dict(failed),
            "FailedAndUnresolvableNodes": dict(unresolvable), "Error": error}


def binding_answer(error: str) -> dict[str, Any]:
    """``ExtenderBindingResult(error=error).wire()``, built directly."""
    return {"Error": error}
