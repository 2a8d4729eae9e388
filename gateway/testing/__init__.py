"""Test and demo equipment: nothing in this package is part of the gateway itself.

``gateway.testing.engine`` runs the real mistral.rs engine (the ``mistralrs``
Python SDK) on a locally generated random-weight model behind a small loopback
HTTP adapter. Its text is the output of random weights, never meaningful
inference.
"""
