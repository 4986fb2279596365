"""Workload autoscaling, the pure part: TensorFusion's recommender in Python, exact to its arithmetic.

The decaying histogram of the Kubernetes VPA (``histogram``), per-worker usage sampling and aggregation
(``usage``: samples, the ``UsageSource`` seam the loop reads them from), the ``autoScalingConfig`` of a
WorkloadProfile with its defaults and the field that failed to parse (``config``), and the recommenders
(``recommend``: percentile estimates, clamps, QoS mapping, threshold, initial delay, cron floors, the
external scaler's answer, merged as TensorFusion merges them). No I/O and no awaits here: the controller
that keeps TensorFusionWorkloads and the resize verb of the ledger call into it.
"""
