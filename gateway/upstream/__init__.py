"""Workers: the transport seam and its HTTP client, the route table, readiness, releases, launch.

``base`` is the seam (:class:`~gateway.upstream.base.WorkerTransport`,
``WorkerStream``); ``client`` is the only module that sends requests to a
worker, over ``wire`` (its lean HTTP/1.1 pool); ``table`` resolves a route to
its worker once per request (``releases``: canary arms, gates, fallback);
``readiness`` polls ``GET /v1/models`` and probes; ``confirm`` waits for the
worker's word on a cancelled request; ``launch`` and ``bundle`` are the
launch contract.

Layer: may import ``admission``, ``ratelimit``, ``books``, ``auth``, ``apis``,
``config``, ``observe``, ``core`` and ``types``.
"""
