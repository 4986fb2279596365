"""AdmissionReview v1: parsing the request, deciding, and building the response.

A review that cannot be parsed never raises out of here: ``parse_review`` raises ``ReviewError`` carrying
the request uid when one could be recovered, so the server can still answer with a denial.

The common review (UTF-8 JSON whose request has the expected types) is read with orjson and checked by
hand; anything else goes the long way (the standard library's decoder, then the pydantic models), which
also gives the error messages. Both ways accept the same reviews and read the same values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from enum import StrEnum
from typing import Any, Literal, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from extender.common.shape import object_problem
from webhook.memo import Mutation, MutationCache, encode_patch
from webhook.mutation import EVERYWHERE, is_opted_in, mutate
from webhook.priority import PriorityPolicy
from webhook.view import ClusterView

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class Outcome(StrEnum):
    MUTATED = "mutated"
    DENIED = "denied"
    SKIPPED = "skipped"
    ERROR = "error"


class GroupVersionKind(BaseModel):
    model_config = ConfigDict(extra="ignore")

    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    uid: str = Field(min_length=1)
    kind: GroupVersionKind
    operation: str
    namespace: str | None = None
    name: str | None = None
    object: dict[str, Any] | None = None
    dry_run: bool | None = Field(default=None, alias="dryRun")


class AdmissionReview(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


class ReviewError(ValueError):
    """The body is not a usable AdmissionReview v1 request."""

    def __init__(self, message: str, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid


# Request and Decision are made for every review: NamedTuples, a third of the cost of frozen dataclasses.
class Request(NamedTuple):
    """What the webhook reads of an AdmissionReview request (``request.kind`` flattened)."""

    uid: str
    operation: str
    group: str = ""  # request.kind.group
    kind: str = ""  # request.kind.kind
    namespace: str | None = None
    object: dict[str, Any] | None = None
    # Decoded by orjson: no NaN or infinite number and no integer beyond 64 bits anywhere in it, so
    # orjson encodes ``object`` exactly (the mutation cache's key).
    plain_json: bool = False


# A run of 19 digits may be an integer beyond 64 bits, which orjson decodes as a float (json as an int).
# Found by mapping every digit to 0 and everything else to a space (faster than a regular expression).
_DIGITS_TO_ZERO = bytes(b"0"[0] if chr(i).isdigit() and i < 128 else b" "[0] for i in range(256))
_LONG_DIGITS = b"0" * 19
_OPTIONAL_STR = (str, type(None))


def loads(body: bytes) -> tuple[Any, bool]:
    """``json.loads(body)``, and whether orjson decoded it: then the value is the one ``json.loads`` gives
    (orjson rejects NaN, Infinity, lone surrogates and non-UTF-8 text; long integers are left to json)."""
    if _LONG_DIGITS not in body.translate(_DIGITS_TO_ZERO):
        try:
            return orjson.loads(body), True
        except orjson.JSONDecodeError:
            pass  # json.loads decides, and words the error
    return json.loads(body), False


def parse_review(body: bytes) -> Request:
    try:
        data, plain = loads(body)
    except RecursionError as exc:
        raise ReviewError("body is not JSON this webhook reads: nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReviewError(f"body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict):
        raise ReviewError(f"body is not an {KIND} object")
    if plain:
        request = _plain_request(data)
        if request is not None:
            return _readable(request)
    uid = _recover_uid(data)
    try:
        review = AdmissionReview.model_validate(data)
    except RecursionError as exc:
        raise ReviewError(f"malformed {API_VERSION} {KIND}: nested too deeply", uid) from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise ReviewError(f"malformed {API_VERSION} {KIND}: {problems}", uid) from exc
    r = review.request
    return _readable(Request(r.uid, r.operation, r.kind.group, r.kind.kind, r.namespace, r.object, plain))


def _readable(request: Request) -> Request:
    """``request``, if its pod has the shape the webhook reads (``extender.common.shape``: text where
    Kubernetes has text, bounded depth); else a ``ReviewError`` naming the field. The API server never sends
    such a pod: checked once here, before anything reads, logs or prints it."""
    if request.object is not None and request.kind == "Pod" and request.group == "":
        problem = object_problem(request.object, "request.object")
        if problem is not None:
            raise ReviewError(f"malformed {API_VERSION} {KIND}: {problem}", request.uid)
    return request


def _plain_request(data: dict[str, Any]) -> Request | None:
    """The request of a review the models would accept as they stand (exact types, nothing to coerce and
    no field given by its Python name), else None: the models decide."""
    request = data.get("request")
    if (data.get("apiVersion") != API_VERSION or data.get("kind") != KIND or "api_version" in data
            or type(request) is not dict or "dry_run" in request):
        return None
    uid, gvk, operation = request.get("uid"), request.get("kind"), request.get("operation")
    namespace, pod, dry_run = request.get("namespace"), request.get("object"), request.get("dryRun")
    if (type(uid) is not str or not uid or type(gvk) is not dict or type(operation) is not str
            or type(namespace) not in _OPTIONAL_STR or type(request.get("name")) not in _OPTIONAL_STR
            or not (pod is None or type(pod) is dict) or not (dry_run is None or type(dry_run) is bool)):
        return None
    group, version, kind = gvk.get("group", ""), gvk.get("version", ""), gvk.get("kind", "")
    if type(group) is not str or type(version) is not str or type(kind) is not str:
        return None
    return Request(uid, operation, group, kind, namespace, pod, True)


def _recover_uid(data: dict[str, Any]) -> str | None:
    request = data.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) and uid else None


def allow(uid: str, patch: list[dict[str, Any]] | None = None, *,
          encoded: str | None = None) -> dict[str, Any]:
    """``encoded``: the patch already encoded (``webhook.memo.encode_patch``)."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encoded if encoded is not None else encode_patch(patch)
    return _review(response)


def deny(uid: str, message: str, code: int = 403) -> dict[str, Any]:
    reason = {400: "BadRequest", 403: "Forbidden", 500: "InternalError", 504: "Timeout"}.get(code, "")
    status = {"status": "Failure", "code": code, "message": message, "reason": reason}
    return _review({"uid": uid, "allowed": False, "status": status})


def encode_review(review: dict[str, Any]) -> bytes:
    """``review`` as JSON (orjson; the standard library's encoder for what orjson refuses, such as a lone
    surrogate that a pod's text can carry into a denial message)."""
    try:
        return orjson.dumps(review)
    except orjson.JSONEncodeError:
        return json.dumps(review).encode()


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


class Decision(NamedTuple):
    response: dict[str, Any]
    outcome: Outcome
    reason: str | None = None  # the deny reason, for metrics
    message: str | None = None


def wants_mutation(request: Request) -> bool:
    """Only pod creation is mutated; everything else passes untouched."""
    return request.operation == "CREATE" and request.kind == "Pod" and request.group == ""


def admit(request: Request, view: ClusterView, *, scheduler_name: str,
          next_index: Callable[[], int], do_not_disrupt: bool = False,
          cache: MutationCache | None = None, generation: Hashable = 0,
          priority: PriorityPolicy = EVERYWHERE) -> Decision:
    """``cache`` (optional) memoizes the mutation; ``generation`` must change whenever the view's pools,
    profiles or templates do (see ``webhook.memo``)."""
    if not wants_mutation(request):
        return Decision(allow(request.uid), Outcome.SKIPPED)
    if request.object is None:
        message = "the pod CREATE review carries no object"
        return Decision(deny(request.uid, message, 400), Outcome.DENIED, "review", message)
    if not is_opted_in(request.object):
        return Decision(allow(request.uid), Outcome.SKIPPED)
    result: Mutation
    namespace = request.namespace or None
    if cache is not None:
        result = cache.mutate(request.object, view, scheduler_name=scheduler_name, index=next_index(),
                              namespace=namespace, do_not_disrupt=do_not_disrupt, generation=generation,
                              plain_json=request.plain_json, priority=priority)
    else:
        full = mutate(request.object, view, scheduler_name=scheduler_name, index=next_index(),
                      namespace=namespace, do_not_disrupt=do_not_disrupt, priority=priority)
        result = Mutation(full.patch, full.denial, full.skipped, full.request)
    if result.skipped:
        return Decision(allow(request.uid), Outcome.SKIPPED)
    if result.denial is not None:
        message = result.denial.message
        return Decision(deny(request.uid, message, 403), Outcome.DENIED, result.denial.reason, message)
    return Decision(allow(request.uid, result.patch, encoded=result.encoded), Outcome.MUTATED)
