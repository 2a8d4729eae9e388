"""The edge: the ASGI app and its routes, the composition root, listener limits, the body guard.

``app.py`` (routes, the one send wrapper, the lifespan), ``runtime.py`` (the
composition root: builds every long-lived object, hands the pipeline its
``Services``, runs reload, drain and shutdown), ``inference.py`` (the edge of
every inference endpoint: authenticate, read the body, plan), ``routes.py``,
``evidence_api.py``, ``responses_api.py``, ``asgi.py`` (scope helpers, error
replies), ``bodyguard.py``, ``protocol.py`` (listener limits), ``cork.py``,
``server.py`` (uvicorn and the signal contract).

Layer: may import everything below it; never ``tools`` or ``testing``.
"""
