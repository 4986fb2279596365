"""TensorFusionCluster: the GPUPools each cluster derives (``derive``), its cloud vendor check
(``vendor``), flags (``config``) and the leader-gated loop that writes them (``loop``)."""
