"""Karpenter-mode launches and compaction: settings (``config``), pure plans (``launch_plan``,
``compaction_plan``), the port to the cluster (``port``), the executors (``launcher``, ``compactor``) and
their leader-gated loops (``loop``)."""
