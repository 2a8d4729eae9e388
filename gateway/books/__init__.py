"""What outlives a request, behind protocols: receipts, kept responses, evidence, state backends.

``protocols.py`` is the seam (evidence catalog, response store, release
store); ``state/`` holds every backend of each kind (``sqlite/`` for one
replica, ``postgres/`` for a fleet) and picks one from ``state.backend``;
``receipts.py`` is the hash-chained JSON-lines writer that never fails open
(``receipt_chain.py`` checks chains for ``receipts verify``);
``responses.py`` keeps Responses answers and conversations (group commit);
``evidence/`` sniffs, stores and leases media.

Layer: may import ``apis``, ``config``, ``observe``, ``core`` and ``types``
(checked by import-linter, ``pyproject.toml``).
"""
