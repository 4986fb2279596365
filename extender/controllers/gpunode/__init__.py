"""GPUNode: one per GPU node, kept from the extender's inventory and ledger: what it should say
(``plan``), flags (``config``) and the throttled writer (``writer``)."""
