"""The filter and bind verbs' extension points, one method each (kube-scheduler's one interface per point).

The filter asks, in this order, every hook of the controller list (a hook leaves alone the points it has no
use for):

0. ``before_filter(pod, node_names) -> outcome | None``: a rule that holds for the pod wherever it would go
   (a namespace's quota, a gang waiting for its members or pinned to its reservations) may answer for the
   cluster state. The first hook with an answer gives the outcome; without one the filter computes it from
   the cluster state. The points below see that outcome either way.
1. ``after_filter(pod, outcome)``: sees the full outcome (which nodes fit, which failed and why) and may
   queue work from it (preemption, scale-up, a scheduler nudge). It returns nothing and changes nothing; one
   that raises is logged and the others still run.
2. ``narrow(pod, outcome) -> outcome``: may take fitting nodes away (defragmentation keeps a pool's pods off
   the nodes it is emptying). Each hook narrows what the one before it left.
3. ``hold_back(pod) -> reason | None``: asked only when no node fits; a reason turns "no node fits" into an
   error, so kube-scheduler retries the pod with backoff instead of parking it (preemption making room).
   The first hook with a reason answers.

The bind verb asks two points:

- ``admit(pod, node) -> reason | None``: asked after the pod's bind is decided and before its GPUs are
  reserved, with no await between the two, so what a hook checks against the ledger still holds when the
  reservation is made (a quota's total). A reason refuses the bind; kube-scheduler retries the pod.
- ``admit_reserved(pod, node, gpu_ids) -> reason | None``: asked right after the reservation, again with
  no await between, for what depends on the GPUs chosen (a quota counting a percent of a GPU in that GPU's
  TFLOPS). A reason releases the reservation and refuses the bind.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from extender.scheduling.state import FilterOutcome

log = logging.getLogger(__name__)


class FilterHook:
    """A controller's part in the filter and bind verbs. Override the points used; the others do nothing."""

    def before_filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome | None:
        return None

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        return None

    def narrow(self, pod: dict[str, Any], outcome: FilterOutcome) -> FilterOutcome:
        return outcome

    def hold_back(self, pod: dict[str, Any]) -> str | None:
        return None

    def admit(self, pod: dict[str, Any], node: str) -> str | None:
        return None

    def admit_reserved(self, pod: dict[str, Any], node: str, gpu_ids: Sequence[str]) -> str | None:
        return None


class FilterHooks:
    """The hooks of every controller, called as the module docstring says."""

    def __init__(self, hooks: Sequence[FilterHook] = ()) -> None:
        cls = FilterHook
        self._before = [h for h in hooks if type(h).before_filter is not cls.before_filter]
        self._after = [h for h in hooks if type(h).after_filter is not cls.after_filter]
        self._narrow = [h for h in hooks if type(h).narrow is not cls.narrow]
        self._hold = [h for h in hooks if type(h).hold_back is not cls.hold_back]
        self._admit = [h for h in hooks if type(h).admit is not cls.admit]
        self._admit_reserved = [h for h in hooks if type(h).admit_reserved is not cls.admit_reserved]

    def before_filter(self, pod: dict[str, Any], node_names: Sequence[str]) -> FilterOutcome | None:
        for hook in self._before:
            if (outcome := hook.before_filter(pod, node_names)) is not None:
                return outcome
        return None

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        for hook in self._after:
            try:
                hook.after_filter(pod, outcome)
            except Exception:
                log.exception("filter hook failed", extra={"hook": type(hook).__name__})

    def narrow(self, pod: dict[str, Any], outcome: FilterOutcome) -> FilterOutcome:
        for hook in self._narrow:
            outcome = hook.narrow(pod, outcome)
        return outcome

    def hold_back(self, pod: dict[str, Any]) -> str | None:
        for hook in self._hold:
            if reason := hook.hold_back(pod):
                return reason
        return None

    def admit(self, pod: dict[str, Any], node: str) -> str | None:
        for hook in self._admit:
            if reason := hook.admit(pod, node):
                return reason
        return None

    def admit_reserved(self, pod: dict[str, Any], node: str, gpu_ids: Sequence[str]) -> str | None:
        for hook in self._admit_reserved:
            if reason := hook.admit_reserved(pod, node, gpu_ids):
                return reason
        return None
