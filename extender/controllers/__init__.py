"""The controllers of ``tf-extender serve``: one package (or module) each, listed once in
``registry.CONTROLLERS``; each builds itself (``wiring``) into reconcilers that the one ``runner`` runs.

The controllers that act on the cluster as a whole act only while this process is the leader:
``leadership.Leadership`` holds one Lease for the process and the runner gates every leader-only
controller on it (see docs/design.md, "Leader election"). This module holds the Leases' names and timings.

This module imports no Kubernetes client: the controllers' option declarations import it, and so does
every ``tf-extender`` command line.
"""

from __future__ import annotations

# The process's Lease. Its name is the one the expander held alone before the controllers shared one
# leader, so RBAC (resourceNames), dashboards and alerts keep working.
LEADER_LEASE = "tensor-fusion-expander"
# The Leases the capacity controllers and defragmentation held on their own before. A new process takes
# them too, after LEADER_LEASE, and leads only once it holds all of them: an old replica in the same
# rolling update (which knows only its own per-controller Leases) then never acts beside a new one.
LEGACY_LEASES = ("tensor-fusion-capacity", "tensor-fusion-defrag")
# client-go's defaults (LeaseDuration, RenewDeadline, RetryPeriod): a leader that has not renewed for the
# deadline stops acting, and the deadline is shorter than the duration another replica waits before it
# takes the Lease, so the two never act at once (docs/design.md, "Leader election").
LEASE_DURATION_SECONDS = 15.0
LEASE_RENEW_DEADLINE_SECONDS = 10.0
LEASE_RENEW_SECONDS = 2.0
