"""The expander's flags (the Lease and its namespace: extender/controllers/leadership.py's tests)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from extender.controllers.expansion.config import ExpansionConfig, add_arguments, from_args


def test_flags_default_from_the_environment() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, {"TF_MAX_INFLIGHT_NODES": "3", "TF_EXPANSION_ENABLED": "false",
                           "POD_NAMESPACE": "gpu-system"})
    config = from_args(parser.parse_args([]))
    assert config == ExpansionConfig(enabled=False, max_in_flight=3)
    config = from_args(parser.parse_args([
        "--expansion", "--expansion-delay", "0.5", "--max-inflight-nodes", "7",
        "--expansion-claim-timeout", "60"]))
    assert (config.enabled, config.delay_seconds, config.max_in_flight,
            config.claim_timeout_seconds) == (True, 0.5, 7, 60.0)


def test_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, {})
    config = from_args(parser.parse_args([]))
    assert (config.enabled, config.delay_seconds, config.max_in_flight) == (True, 10.0, 15)


@pytest.mark.parametrize("kw", [{"max_in_flight": 0}, {"delay_seconds": -1}, {"claim_timeout_seconds": 0}])
def test_bad_settings_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ExpansionConfig(**kw)
