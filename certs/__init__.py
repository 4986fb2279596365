"""Certificates for the webhook and the extender: a CA, serving and client certificates, the
``caBundle`` wiring and hot reload of the serving pair.

Modules, each with one job:

- ``certs.authority``: pure certificate generation and signing (ECDSA P-256).
- ``certs.files``: the on-disk layout (``ca.crt``, ``tls.crt``, ``tls.key``), atomic writes.
- ``certs.kube``: the TLS Secret and the webhook ``caBundle`` through the Kubernetes API.
- ``certs.reload``: an ``ssl.SSLContext`` for aiohttp that follows certificate rotation.
- ``certs.cli``: the ``tf-certs`` command.
"""
