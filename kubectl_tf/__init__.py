"""``kubectl tf``: the kubectl plugin, one front for the project's read and offline commands.

A package of its own beside ``extender`` and ``webhook`` because it fronts both (``status``, ``plan`` and
``simulate`` from the extender, ``mutate`` from the webhook) and neither may import the other back.
"""
