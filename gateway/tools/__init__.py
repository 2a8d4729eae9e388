"""Command-line verbs, the demo and the reference generator: no logic the server needs.

``cli.py`` maps flags onto the typed config and calls the verbs:
``preflight.py`` (``check``), ``demo.py`` / ``demo_engine.py``, ``docgen.py``,
``kustomize.py``, ``receipts_cli.py``, ``release_cli.py``.

Layer: the top; may import everything.
"""
