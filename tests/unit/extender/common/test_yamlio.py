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


def test_a_file_larger_than_the_cap_is_refused_naming_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    big = tmp_path / "big.yaml"
    big.write_bytes(b"a: 1\n" * 1000)
    with pytest.raises(yamlio.InputFileError, match=r"big.yaml: larger than 0 MiB; not read"):
        yamlio.read_text_file(str(big), max_bytes=100)
    assert yamlio.read_text_file(str(big), max_bytes=5000).startswith("a: 1")


def test_an_endless_input_is_read_only_up_to_the_cap() -> None:
    with pytest.raises(yamlio.InputFileError, match="/dev/zero: larger than 1 MiB"):
        yamlio.read_text_file("/dev/zero", max_bytes=1024 * 1024)


def test_a_file_that_is_not_utf8_names_the_file_line_and_byte(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "pods.yaml"
    bad.write_bytes(b"kind: Pod\nmetadata:\n  name: caf\xe9\n")
    with pytest.raises(yamlio.InputFileError, match=r"pods.yaml:3: not UTF-8 text \(byte 31: b'\\xe9'\)"):
        yamlio.read_text_file(str(bad))


def test_a_missing_file_names_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(yamlio.InputFileError, match=r"nope\.yaml: no such file"):
        yamlio.read_text_file(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("text", ["replicas: " + "9" * 5000, '{"replicas": ' + "9" * 5000 + "}",
                                  "a: " + "[" * 20000 + "]" * 20000])
def test_numbers_python_will_not_convert_are_a_named_yaml_error(text: str) -> None:
    with pytest.raises(yamlio.YAMLFileError, match=r"^big.yaml:.*(not readable|not valid) YAML"):
        list(yamlio.iter_documents(text, "big.yaml"))
