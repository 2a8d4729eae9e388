"""Drive a test's own redis-server over ``maxmemory`` and back (``noeviction``).

:func:`fill` sets a small ``maxmemory`` with ``noeviction``, writes filler
keys until Redis refuses one with ``OOM``, then lowers ``maxmemory`` a
margin below what is used, so that the server stays over it however the
tests' own connections come and go (a server filled to the last byte can
slip back under by a few KB and accept one more write). :func:`release`
raises ``maxmemory`` again (0: unlimited); the filler stays.
"""

from __future__ import annotations

from redis.exceptions import OutOfMemoryError

from tests.support.redis import RedisServer

FILL_PREFIX = "fill:"
_HEADROOM = 512 * 1024
_MARGIN = 1024 * 1024
_VALUE = b"x" * 8192
_MAX_KEYS = 10_000


def used_memory(server: RedisServer) -> int:
    with server.client() as client:
        return int(client.info("memory")["used_memory"])


def over_maxmemory(server: RedisServer) -> bool:
    with server.client() as client:
        info = client.info("memory")
    limit = int(info["maxmemory"])
    return limit > 0 and int(info["used_memory"]) > limit


def fill(server: RedisServer) -> int:
    """Fill until a write is refused; the number of filler keys written."""
    with server.client() as client:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", used_memory(server) + _HEADROOM)
        written = 0
        while True:
            try:
                client.set(f"{FILL_PREFIX}{written}", _VALUE)
            except OutOfMemoryError:
                break
            written += 1
            assert written < _MAX_KEYS, "maxmemory never refused a write"
        client.config_set("maxmemory", max(1, used_memory(server) - _MARGIN))
    assert over_maxmemory(server)
    return written


def release(server: RedisServer) -> None:
    with server.client() as client:
        client.config_set("maxmemory", 0)
    assert not over_maxmemory(server)


def keys_besides_filler(server: RedisServer) -> list[str]:
    """Every key but the filler and the readiness probe's (sorted)."""
    with server.client() as client:
        names = [k.decode() for k in client.scan_iter(count=1000)]
    return sorted(n for n in names if not n.startswith(FILL_PREFIX) and not n.endswith("probe"))
