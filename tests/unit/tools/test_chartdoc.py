"""The chart's values.schema.json and README.md come from values.yaml (tools/chartdoc.py); test_docgen keeps
the committed files current, these tests what the generator makes of a values file."""

from __future__ import annotations

import json

import pytest

from tools import chartdoc

VALUES = """\
# A header, not attached to any key.

# The image.
image:
  repository: tfe  # where from
  # @schema {"enum": ["Always", "IfNotPresent"]}
  pullPolicy: IfNotPresent
# @schema {"type": "object"}
resources:
  limits:
    memory: 1Gi
nodeSelector: {}
extraArgs: []
requirements:
- key: a
  values: ["x"]
timeout: 5m
"""


def test_every_mapping_is_closed_and_annotations_win() -> None:
    schema = chartdoc.values_schema(VALUES)
    assert schema["additionalProperties"] is False
    image = schema["properties"]["image"]
    assert image["additionalProperties"] is False and image["description"] == "The image."
    assert image["properties"]["repository"] == {"description": "where from", "type": "string"}
    assert image["properties"]["pullPolicy"] == {"enum": ["Always", "IfNotPresent"]}
    assert schema["properties"]["resources"] == {"type": "object"}  # free-form: no descent
    assert schema["properties"]["nodeSelector"] == {"type": "object"}  # empty: free-form
    assert schema["properties"]["requirements"] == {"type": "array", "items": {"type": "object"}}
    assert schema["properties"]["timeout"] == {"type": "string"}


def test_the_readme_lists_every_leaf_with_its_default_and_comment() -> None:
    text = chartdoc.readme(VALUES, "<!-- generated -->")
    assert "| `image.repository` | `\"tfe\"` | where from |" in text
    assert "| `resources` | `{\"limits\": {\"memory\": \"1Gi\"}}` |  |" in text
    assert "A header" not in text and "### `image`" in text and "The image." in text


def test_a_bad_annotation_names_its_line() -> None:
    with pytest.raises(chartdoc.ValuesDocError, match=r"values\.yaml:2: @schema is not JSON"):
        chartdoc.entries("a:\n  # @schema {nope}\n  b: 1\n")


def test_the_committed_schema_closes_every_key_of_the_chart() -> None:
    from tools.docgen import ROOT

    schema = json.loads((ROOT / chartdoc.SCHEMA_FILE).read_text())

    def open_objects(node: dict, path: str) -> list[str]:  # type: ignore[type-arg]
        out = []
        if "properties" in node and node.get("additionalProperties") is not False:
            out.append(path)
        for key, sub in (node.get("properties") or {}).items():
            out += open_objects(sub, f"{path}.{key}")
        return out

    assert open_objects(schema, "") == []
    assert {"extender", "defrag", "capacity", "expansion", "clusterAutoscaler", "webhook"} <= set(
        schema["properties"])
