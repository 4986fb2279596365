"""The pure scheduling core behind filter, prioritize, bind and preempt: no I/O, never awaits.

``state.ClusterState`` is the facade the server and the controllers use. Behind it: ``cluster`` (the
picture: nodes, GPUs, bound pods, fed by watch events), ``requests`` (the request parse cache),
``verdicts`` (per request shape and node), ``assume`` (holds and reservations of binds in flight),
``preemption``, ``views``; and the pure pieces they build on (``inventory``, ``placement``, ``ledger``,
``columns``, ``pdb``). ``ClusterState.what_if()`` gives planners a quiet copy to try placements on.
"""
