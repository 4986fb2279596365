"""What every lifecycle planner shares: ``Action`` and ``Inputs`` (``action``, ``inputs``), pool settings
(``pool``), amounts, gaps, the instance catalog and its offerings, and the removal rules for empty nodes.
The planners themselves live with their controllers; ``tf-extender plan`` prints what they decide."""
