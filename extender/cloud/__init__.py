"""The cloud compute APIs Provisioned-mode pools launch GPU nodes through: the provider interface
(``provider``), a GPUNodeClass read once (``nodeclass``), the TensorFusionCluster's ``computingVendor``
with its credentials (``vendor``), and one module per cloud (``aws``, ``alibaba``)."""
