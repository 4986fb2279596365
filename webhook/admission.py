"""AdmissionReview v1: parsing the request, deciding, and building the response.

A review that cannot be parsed never raises out of here: ``parse_review`` raises ``ReviewError`` carrying
the request uid when one could be recovered, so the server can still answer with a denial.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook.memo import Mutation, MutationCache, encode_patch
from webhook.mutation import is_opted_in, mutate
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


def parse_review(body: bytes) -> AdmissionReview:
    try:
        data = json.loads(body)
    except RecursionError as exc:
        raise ReviewError("body is not JSON this webhook reads: nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReviewError(f"body is not JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict):
        raise ReviewError(f"body is not an {KIND} object")
    uid = _recover_uid(data)
    try:
        return AdmissionReview.model_validate(data)
    except RecursionError as exc:
        raise ReviewError(f"malformed {API_VERSION} {KIND}: nested too deeply", uid) from exc
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise ReviewError(f"malformed {API_VERSION} {KIND}: {problems}", uid) from exc


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
    """``review`` as JSON. The base64 patch, most of an allowed review's bytes, is spliced in rather than
    passed through the encoder's per-character escaping (base64 needs none)."""
    response = review.get("response")
    patch = response.get("patch") if isinstance(response, dict) else None
    if (not isinstance(patch, str) or not patch.isascii() or '"' in patch or "\\" in patch
            or list(review)[-1] != "response"):
        return json.dumps(review).encode()
    rest = {key: value for key, value in response.items() if key != "patch"}  # type: ignore[union-attr]
    head = json.dumps({**review, "response": rest})
    # the response is the last key, so the text ends with the two closing braces of response and review
    return f'{head[:-2]}, "patch": "{patch}"}}}}'.encode()


def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


@dataclass(frozen=True)
class Decision:
    response: dict[str, Any]
    outcome: Outcome
    reason: str | None = None  # the deny reason, for metrics
    message: str | None = None


def wants_mutation(request: AdmissionRequest) -> bool:
    """Only pod creation is mutated; everything else passes untouched."""
    return request.operation == "CREATE" and request.kind.kind == "Pod" and request.kind.group == ""


def admit(request: AdmissionRequest, view: ClusterView, *, scheduler_name: str,
          next_index: Callable[[], int], do_not_disrupt: bool = False,
          cache: MutationCache | None = None, generation: Hashable = 0) -> Decision:
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
                              namespace=namespace, do_not_disrupt=do_not_disrupt, generation=generation)
    else:
        full = mutate(request.object, view, scheduler_name=scheduler_name, index=next_index(),
                      namespace=namespace, do_not_disrupt=do_not_disrupt)
        result = Mutation(full.patch, full.denial, full.skipped, full.request)
    if result.skipped:
        return Decision(allow(request.uid), Outcome.SKIPPED)
    if result.denial is not None:
        message = result.denial.message
        return Decision(deny(request.uid, message, 403), Outcome.DENIED, result.denial.reason, message)
    return Decision(allow(request.uid, result.patch, encoded=result.encoded), Outcome.MUTATED)
