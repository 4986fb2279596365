"""Settings of the node expander, as ``tf-extender serve`` flags with environment defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from extender.common.contract import DEFAULT_SCHEDULER_NAME
from extender.common.numbers import int_flag
from extender.common.options import duration

DEFAULT_DELAY_SECONDS = 10.0
DEFAULT_MAX_IN_FLIGHT = 15
DEFAULT_CLAIM_TIMEOUT_SECONDS = 900.0
DEFAULT_NAMESPACE = "tensor-fusion-sys"

ENV_ENABLED = "TF_EXPANSION_ENABLED"
ENV_DELAY = "TF_EXPANSION_DELAY_SECONDS"
ENV_MAX_IN_FLIGHT = "TF_MAX_INFLIGHT_NODES"
ENV_CLAIM_TIMEOUT = "TF_EXPANSION_CLAIM_TIMEOUT_SECONDS"
ENV_SCHEDULER_NAME = "TF_EXPANSION_SCHEDULER_NAME"
# The namespace a pod runs in, from the downward API; the placeholders' namespace defaults to it.
ENV_POD_NAMESPACE = "POD_NAMESPACE"


@dataclass(frozen=True)
class ExpansionConfig:
    enabled: bool = True
    delay_seconds: float = DEFAULT_DELAY_SECONDS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    claim_timeout_seconds: float = DEFAULT_CLAIM_TIMEOUT_SECONDS
    scheduler_name: str = DEFAULT_SCHEDULER_NAME

    def __post_init__(self) -> None:
        if self.delay_seconds < 0:
            raise ValueError(f"expansion delay must not be negative, got {self.delay_seconds}")
        if self.max_in_flight < 1:
            raise ValueError(f"max in-flight nodes must be at least 1, got {self.max_in_flight}")
        if self.claim_timeout_seconds <= 0:
            raise ValueError(f"claim timeout must be positive, got {self.claim_timeout_seconds}")


def _env_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {value!r}")


def add_arguments(parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None) -> None:
    """Add the ``--expansion-*`` flags; each defaults to its environment variable, then to the default."""
    env = os.environ if environ is None else environ
    group = parser.add_argument_group("node expansion (Karpenter NodeClaims for capacity-only failures)")
    group.add_argument(
        "--expansion", dest="expansion_enabled", action=argparse.BooleanOptionalAction,
        default=_env_bool(env[ENV_ENABLED]) if ENV_ENABLED in env else True,
        help=f"create NodeClaims for pods that fail only for lack of GPU capacity (env {ENV_ENABLED})",
    )
    group.add_argument(
        "--expansion-delay", dest="expansion_delay", type=duration("--expansion-delay"), metavar="DURATION",
        default=env.get(ENV_DELAY, DEFAULT_DELAY_SECONDS),
        help="wait this long after a rejection before expanding, so that existing capacity is retried "
             f"(env {ENV_DELAY})",
    )
    group.add_argument(
        "--max-inflight-nodes", dest="max_inflight_nodes", type=int_flag(0), metavar="N",
        default=env.get(ENV_MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT),
        help=f"at most this many created NodeClaims waiting for their node (env {ENV_MAX_IN_FLIGHT})",
    )
    group.add_argument(
        "--expansion-claim-timeout", dest="expansion_claim_timeout", metavar="DURATION",
        type=duration("--expansion-claim-timeout", positive=True),
        default=env.get(ENV_CLAIM_TIMEOUT, DEFAULT_CLAIM_TIMEOUT_SECONDS),
        help=f"give up waiting for a created claim's node after this long (env {ENV_CLAIM_TIMEOUT})",
    )
    group.add_argument(
        "--expansion-scheduler-name", dest="expansion_scheduler_name", metavar="NAME",
        default=env.get(ENV_SCHEDULER_NAME) or DEFAULT_SCHEDULER_NAME,
        help="the scheduler profile whose Unschedulable pods with no candidate node at all may grow a GPU "
             f"pool from zero (env {ENV_SCHEDULER_NAME})",
    )


def from_args(args: argparse.Namespace) -> ExpansionConfig:
    return ExpansionConfig(
        enabled=bool(args.expansion_enabled),
        delay_seconds=float(args.expansion_delay),
        max_in_flight=int(args.max_inflight_nodes),
        claim_timeout_seconds=float(args.expansion_claim_timeout),
        scheduler_name=str(getattr(args, "expansion_scheduler_name", DEFAULT_SCHEDULER_NAME)),
    )
