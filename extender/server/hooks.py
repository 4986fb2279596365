"""The filter verb's extension points, one method each (kube-scheduler's one interface per point).

The filter computes its outcome from the cluster state, then calls, in this order, on every hook of the
controller list (a hook leaves alone the points it has no use for):

1. ``after_filter(pod, outcome)``: sees the full outcome (which nodes fit, which failed and why) and may
   queue work from it (preemption, scale-up, a scheduler nudge). It returns nothing and changes nothing; one
   that raises is logged and the others still run.
2. ``narrow(pod, outcome) -> outcome``: may take fitting nodes away (defragmentation keeps a pool's pods off
   the nodes it is emptying). Each hook narrows what the one before it left.
3. ``hold_back(pod) -> reason | None``: asked only when no node fits; a reason turns "no node fits" into an
   error, so kube-scheduler retries the pod with backoff instead of parking it (preemption making room).
   The first hook with a reason answers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from extender.scheduling.state import FilterOutcome

log = logging.getLogger(__name__)


class FilterHook:
    """A controller's part in the filter verb. Override the points used; the others do nothing."""

    def after_filter(self, pod: dict[str, Any], outcome: FilterOutcome) -> None:
        return None

    def narrow(self, pod: dict[str, Any], outcome: FilterOutcome) -> FilterOutcome:
        return outcome

    def hold_back(self, pod: dict[str, Any]) -> str | None:
        return None


class FilterHooks:
    """The hooks of every controller, called as the module docstring says."""

    def __init__(self, hooks: Sequence[FilterHook] = ()) -> None:
        cls = FilterHook
        self._after = [h for h in hooks if type(h).after_filter is not cls.after_filter]
        self._narrow = [h for h in hooks if type(h).narrow is not cls.narrow]
        self._hold = [h for h in hooks if type(h).hold_back is not cls.hold_back]

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
