"""Authentication and authorization (spec §3, §4 "Scopes", §5, §12 "Credentials").

``authenticator`` turns a bearer credential into a :class:`~gateway.auth.principal.Principal`
(JWTs through ``tokens`` and ``keys``, static keys through ``apikeys``) and
authorizes it for a tenant's endpoint; ``failures`` says why one was refused
(operators only). Each module opens with its theory of operation.

Layer: may import ``config``, ``core`` and ``types`` (checked by import-linter).
"""
