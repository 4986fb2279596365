"""Reading the AdmissionReview the fast way (orjson and a hand check of the request's types) gives exactly
what the long way (json.loads and the pydantic models) gives: the same values, the same accepted and
refused reviews; the answer and the admission line are the same JSON whichever encoder writes them."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from extender.common.batched_log import BatchedLog
from webhook.admission import (
    AdmissionReview,
    Request,
    ReviewError,
    allow,
    deny,
    encode_review,
    loads,
    parse_review,
)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
                         st.integers(min_value=-(2**64), max_value=2**64),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(
    json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                          st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=20)


@given(json_values, st.booleans())
def test_loads_gives_what_json_loads_gives(value: Any, ascii_only: bool) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    # repr tells 1 from 1.0 and True from 1, and shows the keys' order
    assert repr(loads(body)[0]) == repr(json.loads(body))


@pytest.mark.parametrize("body", [
    b"[NaN]", b"[Infinity, -Infinity]", b"[1e309]", b'["\\ud800"]', b"[12345678901234567890]",
    b"[-9223372036854775809]", b"[1234567890123456789]", "[1]".encode("utf-16"),
])
def test_what_orjson_reads_otherwise_is_left_to_json(body: bytes) -> None:
    value, plain = loads(body)
    assert not plain
    assert repr(value) == repr(json.loads(body))


def test_plain_json_is_marked() -> None:
    assert loads(b'{"a": [1, 2.5, "x", null, true, 123456789012345678]}') == (
        {"a": [1, 2.5, "x", None, True, 123456789012345678]}, True)


def by_models(body: bytes) -> Request | str:
    """The long way: json.loads and the pydantic models (what parse_review did before its fast path)."""
    try:
        r = AdmissionReview.model_validate(json.loads(body)).request
    except ValidationError:
        return "refused"
    return Request(r.uid, r.operation, r.kind.group, r.kind.kind, r.namespace, r.object, loads(body)[1])


def by_parse_review(body: bytes) -> Request | str:
    try:
        return parse_review(body)
    except ReviewError:
        return "refused"


MISSING = object()
any_value = st.one_of(st.just(MISSING), st.none(), st.booleans(), st.integers(-2, 2), st.floats(0, 1),
                      st.sampled_from(["", "x", "true", "Pod", "CREATE", "1"]), st.just({}), st.just([]),
                      st.just({"metadata": {"name": "p"}}))


def field(name: str, good: Any) -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.just(name), st.one_of(st.just(good), any_value))


@given(st.tuples(field("uid", "u-1"), field("operation", "CREATE"), field("namespace", "ns"),
                 field("name", None), field("object", {"metadata": {"name": "p"}}), field("dryRun", False),
                 field("dry_run", MISSING)),
       st.tuples(field("group", ""), field("version", "v1"), field("kind", "Pod")),
       st.one_of(st.just(MISSING), st.just({})),
       st.tuples(field("apiVersion", "admission.k8s.io/v1"), field("kind", "AdmissionReview"),
                 field("api_version", MISSING)))
def test_the_fast_way_accepts_and_reads_exactly_what_the_models_do(
        request_fields: tuple[tuple[str, Any], ...], kind_fields: tuple[tuple[str, Any], ...],
        kind_is: Any, review_fields: tuple[tuple[str, Any], ...]) -> None:
    kind = {k: v for k, v in kind_fields if v is not MISSING} if kind_is is MISSING else kind_is
    request = {"kind": kind, **{k: v for k, v in request_fields if v is not MISSING}}
    review = {**{k: v for k, v in review_fields if v is not MISSING}, "request": request}
    body = json.dumps(review).encode()
    assert by_parse_review(body) == by_models(body)


@pytest.mark.parametrize("review", [
    allow("u-1", [{"op": "add", "path": "/spec/schedulerName", "value": "s"}]),
    deny("u-2", 'the pod\'s "text" carries a lone surrogate: \ud800', 403),
    deny("u-\udcff", "ünïcode", 400),
], ids=["patch", "surrogate in message", "surrogate in uid"])
def test_answers_are_the_same_json_whichever_encoder_writes_them(review: dict[str, Any]) -> None:
    assert json.loads(encode_review(review)) == review


@given(st.floats(min_value=0, max_value=4e9))
def test_the_admission_line_timestamp_is_datetimes(now: float) -> None:
    line = BatchedLog(logging.getLogger("test.admission.ts"))
    expected = dt.datetime.fromtimestamp(now, dt.UTC).isoformat(timespec="milliseconds")
    assert line.timestamp(now) == expected
    assert line.timestamp(math.floor(now) + 0.9999996) == dt.datetime.fromtimestamp(
        math.floor(now) + 0.9999996, dt.UTC).isoformat(timespec="milliseconds")


def test_a_line_orjson_refuses_is_written_by_json() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test.admission.surrogate")
    logger.setLevel(logging.INFO)
    BatchedLog(logger, stream).write(logging.INFO, "admission", {"detail": "bad \ud800", "n": 1.5})
    line = json.loads(stream.getvalue())
    assert (line["detail"], line["n"], line["logger"]) == ("bad \ud800", 1.5, "test.admission.surrogate")


@pytest.mark.parametrize("review", [
    allow("u-1", [{"op": "add", "path": "/spec/schedulerName", "value": "s"}]),
    allow("u-2"),
    allow('u"3\\', [{"op": "add", "path": "/metadata/labels/a~1b", "value": "ünïcode \"q\""}]),
    deny("u-4", 'bad "value" \\ ünïcode', 403),
    {"apiVersion": "v", "response": {"uid": "x", "patch": "abc"}, "kind": "AdmissionReview"},  # not last
    {"response": {"uid": "x", "patch": 'a"b'}},
], ids=["patch", "no patch", "escapes", "denial", "response not last", "quote in patch"])
def test_encoded_reviews_are_the_same_json(review: dict[str, Any]) -> None:
    assert json.loads(encode_review(review)) == review

