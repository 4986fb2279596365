"""Gangs: pods that run all together or not at all (DESIGN §6e), as pure decisions over the cluster state.

- ``quorum``: which pods of a gang are here, bound or waiting, and whether the quorum exists;
- ``placement``: every waiting member's node and GPUs chosen together, by the pool's placement mode, on a
  what-if copy of the picture; all of the required members or none.

The contract (keys, stamps, validation) is ``extender.common.gang``, shared with the webhook. The controller
that keeps the holds, times gangs out and reports them is ``extender.controllers.gang``.
"""
