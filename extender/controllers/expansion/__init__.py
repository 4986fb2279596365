"""Capacity-only failures become nodes: detection (``detect``, ``fit``), the pure decision (``decide``,
``inflight``), Karpenter NodeClaims (``karpenter``, ``nodeclaim``), the Cluster Autoscaler's placeholder and
reservation pods (``placeholders``, ``placeholder_pods``, ``reservations``), settings (``config``,
``provisioner``), the port (``port``, ``placeholder_port``) and the worker loop (``worker``)."""
