"""The generated references (docs/reference/) say what the programs do now."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import docgen


def test_the_committed_references_are_what_make_docs_writes_now() -> None:
    outdated = docgen.stale()
    assert not outdated, (f"{', '.join(map(str, outdated))} out of date with the code: "
                          f"run `{docgen.COMMAND}` (python -m tools.docgen) and commit the result")


def test_every_flag_of_serve_help_is_in_the_flag_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from extender import cli

    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag: no name broken at a hyphen
    (serve,) = [a for a in cli.build_parser()._actions if a.dest == "command"]
    help_text = serve.choices["serve"].format_help()  # type: ignore[index]
    flags = set(re.findall(r"(--[a-z][a-z0-9-]+)", help_text))
    reference = (docgen.ROOT / docgen.FLAGS_FILE).read_text(encoding="utf-8")
    assert len(flags) > 30
    assert sorted(f for f in flags if f"`{f}`" not in reference) == []


def test_the_metric_reference_names_counters_as_prometheus_exposes_them() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge

    def registry() -> CollectorRegistry:
        out = CollectorRegistry()
        Counter("tf_example_things", "Things done, by outcome", ["outcome"], registry=out)
        Gauge("tf_example_level", "A level | with a pipe", registry=out)
        return out

    text = docgen.metrics_markdown([("example", registry)])
    assert "| `tf_example_things_total` | counter | `outcome` | Things done, by outcome |" in text
    assert "| `tf_example_level` | gauge |  | A level \\| with a pipe |" in text


def test_check_mode_names_the_command_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert "run `make docs`" in capsys.readouterr().err
    assert docgen.main(["--root", str(tmp_path)]) == 0
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0


def test_the_serve_flags_name_the_environment_variable_that_sets_them() -> None:
    from tools.docgen import flags_markdown

    text = flags_markdown()
    assert "| `--bind-deadline` | `TF_EXTENDER_BIND_DEADLINE` | `55s` |" in text
    assert "| `--request-timeout` | `TF_WEBHOOK_REQUEST_TIMEOUT` | `8s` |" in text
    assert "| `--config` | `TF_EXTENDER_CONFIG` |" in text
    # commands that read no environment keep three columns
    plan = text.split("### `tf-extender plan`", 1)[1].split("###", 1)[0]
    assert "| flag | default | what it does |" in plan and "environment" not in plan
