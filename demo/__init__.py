"""The demo: the whole product on a local control plane, a small GPU cluster and sample pods, and a table
of where each pod landed. Run it with ``make demo`` (or ``python -m demo`` from the repository root);
``--once`` checks every placement and exits.
"""
