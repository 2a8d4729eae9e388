"""Talking to the worker: the wire client, its transport pool and the readiness poll.

``client`` is the only module that sends requests to the worker; ``wire`` is
its lean HTTP/1.1 transport; ``readiness`` polls ``GET /v1/models``.
"""
