"""The extender's HTTP face and bind path: the aiohttp app (``app``), the wire models (``protocol``), the
binder that commits GPUs with the Binding (``binder``, ``confirm``), the server's metrics and the stranded
pod collector."""
