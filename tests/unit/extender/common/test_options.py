"""One convention for options: --x/--no-x switches, Go durations (bare seconds deprecated), every ``serve``
option also from TF_EXTENDER_<FLAG> / TF_WEBHOOK_<FLAG> or a ``--config`` YAML file, bad YAML reported
with its file and line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from certs import cli as certs_cli
from extender import cli
from extender.common import options
from extender.common.timefmt import format_duration, parse_duration
from webhook import cli as webhook_cli


def _serve_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return options.configurable(cli.serve_parser(parser))


@pytest.mark.parametrize("build", [cli.build_parser, webhook_cli.build_parser, certs_cli.build_parser],
                         ids=["extender", "webhook", "certs"])
def test_every_switch_has_both_forms(build) -> None:  # type: ignore[no-untyped-def]
    (commands,) = [a for a in build()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert not isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction), (
                f"{name} {action.option_strings}: a switch is --x/--no-x (argparse.BooleanOptionalAction)")


def test_every_time_option_takes_a_go_duration() -> None:
    timed = [a for a in _serve_actions(cli.build_parser()) if isinstance(a.type, options.DurationType)]
    assert {a.option_strings[0] for a in timed} == {
        "--bind-deadline", "--gpu-status-interval", "--defrag-replacement-timeout", "--expansion-delay",
        "--expansion-claim-timeout", "--capacity-interval", "--node-protection-time", "--autoscale-interval",
        "--node-join-timeout", "--orphan-grace", "--capacity-error-backoff", "--gang-reserve-timeout",
        "--tensorfusion-cluster-interval", "--autoscale-prometheus-step",
        "--gpu-node-interval", "--gpu-quota-status-interval"}
    args = cli.build_parser().parse_args([
        "serve", "--bind-deadline", "30s", "--expansion-claim-timeout", "15m",
        "--gpu-status-interval", "500ms", "--node-protection-time", "1h30m"])
    assert (args.bind_deadline, args.expansion_claim_timeout, args.gpu_status_interval,
            args.node_protection_time) == (30.0, 900.0, 0.5, 5400.0)


def test_bare_seconds_still_work_with_a_deprecation_line(caplog: pytest.LogCaptureFixture) -> None:
    options.take_deprecations()
    args = cli.build_parser().parse_args(["serve", "--expansion-delay", "5", "--bind-deadline", "40"])
    assert (args.expansion_delay, args.bind_deadline) == (5.0, 40.0)
    lines = options.take_deprecations()
    assert lines == ["--expansion-delay 5: bare seconds are deprecated, write a Go duration (5s)",
                     "--bind-deadline 40: bare seconds are deprecated, write a Go duration (40s)"]
    assert options.take_deprecations() == []


@pytest.mark.parametrize("bad", [["--bind-deadline", "0s"], ["--bind-deadline", "soon"],
                                 ["--capacity-interval", "-5s"], ["--expansion-claim-timeout", "0"]])
def test_a_bad_duration_is_a_usage_error_naming_the_flag(bad: list[str],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", *bad])
    assert exc.value.code == 2
    assert bad[0] in capsys.readouterr().err


@pytest.mark.parametrize("seconds", [0.0, 0.25, 1.0, 55.0, 300.0, 900.0, 5400.0, 3601.5])
def test_format_duration_reads_back(seconds: float) -> None:
    text = format_duration(seconds)
    assert parse_duration(text).total_seconds() == seconds
    assert format_duration(900.0) == "15m" and format_duration(5400.0) == "1h30m"


def test_every_serve_option_has_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    names = {options.env_name(cli.ENV_PREFIX, a.option_strings[0]) for a in _serve_actions(parser)}
    assert len(names) == len(_serve_actions(parser)) == 60
    assert "TF_EXTENDER_BIND_DEADLINE" in names and "TF_EXTENDER_NO_PREEMPTOR" not in names
    monkeypatch.setenv("TF_EXTENDER_BIND_DEADLINE", "20s")
    monkeypatch.setenv("TF_EXTENDER_PREEMPTOR", "false")
    monkeypatch.setenv("TF_EXTENDER_MAX_PODS_PER_NODE", "32")
    monkeypatch.setenv("TF_EXTENDER_INVENTORY_SOURCE", "node-labels")
    args = options.parse_with_sources(parser, cli.serve_parser(parser), ["serve", "--max-pods-per-node", "8"],
                                      cli.ENV_PREFIX)
    assert (args.bind_deadline, args.preemptor, args.inventory_source) == (20.0, False, "node-labels")
    assert args.max_pods_per_node == 8  # the command line wins


def test_a_config_file_sets_options_below_the_environment_and_the_command_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text("bind-deadline: 45s\nexpansion: false\nmax-pods-per-node: 64\nlog-level: debug\n"
                      "write-gpu-status: true\ncatalog-configmap: tensor-fusion-sys/catalog\n")
    monkeypatch.setenv("TF_EXTENDER_MAX_PODS_PER_NODE", "16")
    parser = cli.build_parser()
    argv = ["serve", "--config", str(config), "--log-level", "warning"]
    args = options.parse_with_sources(parser, cli.serve_parser(parser), argv, cli.ENV_PREFIX)
    assert (args.bind_deadline, args.expansion_enabled, args.write_gpu_status) == (45.0, False, True)
    assert (args.max_pods_per_node, args.log_level) == (16, "warning")
    assert args.catalog_configmap == "tensor-fusion-sys/catalog"
    monkeypatch.setenv("TF_EXTENDER_CONFIG", str(config))
    parser = cli.build_parser()
    args = options.parse_with_sources(parser, cli.serve_parser(parser), ["serve"], cli.ENV_PREFIX)
    assert args.bind_deadline == 45.0


@pytest.mark.parametrize(("text", "message"), [
    ("bind-deadline: 45s\nbind-dedline: 1m\n", "extender.yaml:2: unknown option 'bind-dedline': did you mean "
                                               "'bind-deadline'?"),
    ("port: 80\nexpansion: maybe\n", "extender.yaml:2: --expansion is a switch: 'maybe' is not true or "
                                     "false"),
    ("inventory-source: magic\n", "extender.yaml:1: --inventory-source: 'magic' is not one of"),
    ("max-pods-per-node: lots\n", "extender.yaml:1: argument --max-pods-per-node: 'lots' is not an integer"),
    ("bind-deadline: [1, 2]\n", "extender.yaml:1: --bind-deadline takes one value"),
    ("bind-deadline: 45s\n  port: 1\n", "extender.yaml:2:"),
    ("- bind-deadline\n", "expected a mapping of option names to values, not list"),
])
def test_a_bad_config_file_is_a_usage_error_naming_the_file_line_and_key(
        tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "extender.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--config", str(config)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_yaml_names_the_file_line_and_column(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("a: 1\nb: [2, 3\nc: 4\n")
    with pytest.raises(options.OptionSourceError, match=r"bad\.yaml:3:\d+: not valid YAML"):
        options.load_yaml_file(config)
    with pytest.raises(options.OptionSourceError, match=r"missing\.yaml: no such file or directory"):
        options.load_yaml_file(tmp_path / "missing.yaml")


def test_a_bad_environment_variable_names_itself(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TF_EXTENDER_BIND_DEADLINE", "soon")
    with pytest.raises(SystemExit):
        cli.main(["serve"])
    assert "TF_EXTENDER_BIND_DEADLINE: argument --bind-deadline: 'soon' is not a duration" in (
        capsys.readouterr().err)


def test_the_environment_is_read_only_for_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_EXTENDER_CLUSTER", "not-a-file")  # not an option of serve: ignored
    args = cli.build_parser().parse_args(["status"])
    assert args.command == "status"


def test_the_webhook_reads_the_same_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "webhook.yaml"
    config.write_text("cert-dir: /certs\nrequest-timeout: 4s\n")
    monkeypatch.setenv("TF_WEBHOOK_SCHEDULER_NAME", "gpu-scheduler")
    parser = webhook_cli.build_parser()
    args = options.parse_with_sources(parser, webhook_cli.serve_parser(parser),
                                      ["serve", "--config", str(config)], webhook_cli.ENV_PREFIX)
    assert (str(args.cert_dir), args.request_timeout, args.scheduler_name) == ("/certs", 4.0, "gpu-scheduler")
    with pytest.raises(SystemExit):  # --cert-dir is still required when nothing gives it
        webhook_cli.build_parser().parse_args(["serve"])


def test_serve_logs_each_deprecation_once_logging_is_set_up(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    options.take_deprecations()
    assert cli.main(["serve", "--bind-deadline", "30", "--kubeconfig", str(tmp_path / "missing")]) == 2
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert [(line["level"], line["msg"]) for line in lines] == [
        ("warning", "--bind-deadline 30: bare seconds are deprecated, write a Go duration (30s)")]


@pytest.mark.parametrize(("text", "needle"), [
    ("9" * 400, "too long for a number"), ("99999999999999999999", "is above"),
    ("99999999999999h", "is longer than any duration can be"),
])
def test_a_duration_flag_too_long_to_hold_is_a_usage_error_not_an_overflow(text: str, needle: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=needle):
        options.duration("--bind-deadline")(text)
