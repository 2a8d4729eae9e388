"""The pure core: SSE framing and validation, body layout, outcomes, error codes, digests.

Nothing here imports an I/O library (asyncio, httpx, starlette, sqlite3,
anyio, redis, asyncpg), and each module stands alone (import-linter's
independence contract): they take values and return values or raise
:class:`~gateway.core.errors.GatewayError`, whose codes decide every HTTP
status in one place.

Layer: may import only ``types``.
"""
