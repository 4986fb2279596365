"""Defragmentation: settings and cron (``config``, ``cron``), the pure plan (``plan``, also behind
``tf-extender plan --defrag``), the port to the cluster (``port``) and the run loop (``runner``)."""
