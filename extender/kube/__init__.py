"""Kubernetes I/O shared by the extender and the webhook: client, resources, watch caches, events."""
