"""The shared vocabulary: what ``tf-webhook`` and ``tf-extender`` both speak.

The pod contract (``contract``: every ``tensor-fusion.ai/*`` pod key and its parsing), every other
well-known key (``labels``: ours, Karpenter's, Kubernetes' and NVIDIA's), quantities, pod identity
(``pods``), the shape a request's API object must have before it is read (``shape``), Go durations and
RFC 3339 times (``timefmt``), logging and task helpers. It imports nothing
else of the project (tests/unit/project/test_layout.py holds that), so the webhook can use it whole.
"""
