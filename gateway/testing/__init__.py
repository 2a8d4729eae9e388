"""Test and demo equipment, never part of the request path.

- ``simulator``: the mistral.rs protocol SIMULATOR (labelled filler text,
  never inference) that integration tests, the benchmark and ``make demo``
  put behind the gateway.
- ``engine``: an adapter around the real mistral.rs engine (PyPI
  ``mistralrs``) on a locally generated random-weight model -- real
  inference of meaningless text, for fidelity tests; never ``mistralrs serve``.
- ``harness``: the gateway and simulator in-process on loopback.
- ``samples``: tiny generated media for demos and tests.
"""
