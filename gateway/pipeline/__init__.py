"""One inference request's life, one step per module (spec §5 to §10, §13).

The steps, in order (``steps.py`` runs them; ``gateway/http/inference.py`` is
the edge that authenticates, reads the body and plans before handing over):

1. resolve (``steps.resolve``): the alias's route and worker, once (§16)
2. records (``media.lease_records``): catalog lookups and leases, no file read
3. layout (``media.body_layout``): the forwarded body's size, checked before the permit
4. limits (``steps``): the tenant's rate reservation
5. admit (``admit.permit_for``): the worker's admission permit
6. media (``media.stage_inline``): inline data staged only now, its slots refilled
7. worker (``worker.call_worker``): the body sent in pieces, evidence read only now;
   the relay (``relay.py``) validates and re-streams, or collects; a release's
   fallback (``fallback.py``) may try the other arm once
8. settle (``settle.finish``): the one ``finally``: permits, leases, reservation,
   outcome, receipt, metrics, span

Layer: may import ``upstream``, ``admission``, ``ratelimit``, ``books``,
``auth``, ``apis``, ``config``, ``observe``, ``core`` and ``types``; never
``http`` or ``tools`` (checked by import-linter, ``pyproject.toml``).
A request's state is ``call.py`` (``Call``, then ``Routed`` and ``Attempt``
as they become known); the long-lived objects it runs on reach it as one
``services.Services``, built by the composition root (``gateway/http/runtime.py``).
"""
