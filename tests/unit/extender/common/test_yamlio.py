"""The offline tools' YAML reading: libyaml's loader, the JSON fast path, errors with file and line."""

from __future__ import annotations

import json

import pytest
import yaml

from extender.common import yamlio


def test_the_c_loader_is_used_where_pyyaml_has_it() -> None:
    assert yamlio.FAST is hasattr(yaml, "CSafeLoader")
    assert issubclass(yamlio.Loader, getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def test_documents_json_and_yaml_read_alike() -> None:
    objects = [{"kind": "Pod", "metadata": {"name": "a"}}, {"kind": "Node", "metadata": {"name": "n"}}]
    as_yaml = list(yamlio.iter_documents(yaml.safe_dump_all(objects), "x.yaml"))
    as_json = list(yamlio.iter_documents(json.dumps({"kind": "List", "items": objects}), "x.json"))
    assert as_yaml == objects
    assert as_json == [{"kind": "List", "items": objects}]
    # flow-style YAML that is not JSON goes to the YAML loader
    assert list(yamlio.iter_documents("{kind: Pod}", "f.yaml")) == [{"kind": "Pod"}]


@pytest.mark.parametrize(("text", "where"), [
    ("kind: Pod\nmetadata:\n  name: a\n   labels: {}\n", "pods.yaml:4:"),
    ("a: 1\n---\nb: [1, 2\n", "pods.yaml:4:"),
    ('{"kind": "Pod", "x": [}', "pods.yaml:1:"),
])
def test_bad_yaml_names_the_file_and_the_line(text: str, where: str) -> None:
    with pytest.raises(yamlio.YAMLFileError) as caught:
        list(yamlio.iter_documents(text, "pods.yaml"))
    message = str(caught.value)
    assert message.startswith(where) and "not valid YAML" in message and "\n" not in message


@pytest.mark.parametrize("text", [
    "a: &x [1, 2]\nb: *x\n",
    "base: &b {x: 1}\nd:\n  <<: *b\n  y: 2\n",
    "t: 2026-01-01T00:00:00Z\nn: null\nf: 1.5\nb: yes\ni: 0x1f\ns: '7'\n",
    "- !!set {a, b}\n- !!binary aGk=\n- {1: one, [1, 2]: pair}\n",
    "kind: Pod\nmetadata: {name: a, labels: {x: 'y'}}\nspec:\n  containers:\n  - name: c\n    ports: [80]\n",
])
def test_the_short_path_builds_what_the_safe_loader_builds(text: str) -> None:
    try:
        expected = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        with pytest.raises(yamlio.YAMLFileError):
            list(yamlio.iter_documents(text, "x.yaml"))
        return
    assert list(yamlio.iter_documents(text, "x.yaml")) == expected


def test_aliases_share_one_object_so_an_alias_bomb_stays_small() -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    (document,) = yamlio.iter_documents("\n".join(levels) + "\n", "bomb.yaml")
    assert document["a8"][0] is document["a8"][9] is document["a7"]
