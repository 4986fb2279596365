"""``--autoscale``: TensorFusion's workload autoscaling on the extender's ledger.

Every ``--autoscale-interval`` the loop groups bound GPU pods into workloads (their
``tensor-fusion.ai/workload`` label), keeps one TensorFusionWorkload per workload (worker count,
``status.recommendation``, ``status.activeCronScalingRule``, condition ``ResourceUpdate``), reads usage
samples from a ``UsageSource``, asks the pure recommender (extender/autoscaling) and, where
``autoSetResources`` is enabled, resizes each worker in place through the ledger (extender/server/resize.py).
"""
