"""JSON Patch: pointer escaping, and a diff that turns one document into the other."""

from __future__ import annotations

from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.patch import diff, escape_pointer_token


@pytest.mark.parametrize(("token", "escaped"), [("a/b", "a~1b"), ("a~b", "a~0b"), ("~/", "~0~1"), ("x", "x")])
def test_pointer_escaping(token: str, escaped: str) -> None:
    assert escape_pointer_token(token) == escaped


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(_JSON, _JSON)
def test_diff_turns_one_document_into_the_other(before: Any, after: Any) -> None:
    assert jsonpatch.apply_patch(before, diff(before, after)) == after
    assert diff(after, after) == []

