"""The state backends (spec §17): SQLite for one replica, PostgreSQL for a fleet.

``open_state`` (``factory.py``) picks one from ``state.backend``; everything
else sees only the protocols of ``gateway/books/protocols.py``.
"""
