"""Tenant limits shared through a store seam (spec §7, §12, §15).

``core`` is the pure math (buckets, day counters, verdicts, headers);
``base`` is the seam (:class:`LimitsStore`, :class:`Hold`); ``memory`` and
``redis_store`` are its two implementations; ``flusher`` is the bounded
settlement queue of the remote store, ``leases`` the renewal of its
concurrency slots, ``keys`` and ``scripts`` its key names and Lua scripts;
``factory`` picks one from the config.
Each module opens with its theory of operation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gateway.ratelimit.base import Hold, LimitsStore, NullMetrics, StoreMetrics
from gateway.ratelimit.core import TenantLimits, format_reset, retry_after

if TYPE_CHECKING:
    from gateway.ratelimit.factory import build_limits_store, lease_for
    from gateway.ratelimit.keys import tenant_keys
    from gateway.ratelimit.memory import MemoryLimitsStore
    from gateway.ratelimit.redis_store import RedisLimitsStore

# The stores load asyncio and redis-py; importing the pure core (``core``,
# ``base``) through this package must not (tests/core/test_purity.py).
_STORES = {
    "build_limits_store": "factory",
    "lease_for": "factory",
    "MemoryLimitsStore": "memory",
    "RedisLimitsStore": "redis_store",
    "tenant_keys": "keys",
}


def __getattr__(name: str) -> Any:
    module = _STORES.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(f"gateway.ratelimit.{module}"), name)


__all__ = [
    "Hold",
    "LimitsStore",
    "MemoryLimitsStore",
    "NullMetrics",
    "RedisLimitsStore",
    "StoreMetrics",
    "TenantLimits",
    "build_limits_store",
    "format_reset",
    "lease_for",
    "retry_after",
    "tenant_keys",
]
