"""The Redis store's key names: ``<key_prefix>{<tenant as UTF-8 hex>}:<kind>``.

The hex spelling makes the mapping from tenant names to keys injective (no
tenant name can address another tenant's keys or pattern-match them); the
braces are a cluster hash tag, so one tenant's keys share a slot and one
script may touch them all. The layout and TTLs are in ``scripts``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["TenantKeys", "tenant_keys"]


@dataclass(frozen=True, slots=True)
class TenantKeys:
    requests: str
    tokens: str
    day: str
    slots: str
    holds: str
    void: str
    #: the KEYS of the ``reserve`` and ``settle`` scripts, in their order (built
    #: once per tenant, not on every request)
    reserve: tuple[str, ...] = field(init=False, repr=False, compare=False)
    settle: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        reserve = (self.requests, self.tokens, self.day, self.slots, self.holds, self.void)
        object.__setattr__(self, "reserve", reserve)
        object.__setattr__(self, "settle", reserve[1:])


def tenant_keys(prefix: str, tenant: str) -> TenantKeys:
    """The tenant's keys; injective in ``tenant`` for any prefix without braces."""
    if "{" in prefix or "}" in prefix:
        raise ValueError("key_prefix must not contain braces (they are the hash tag)")
    base = f"{prefix}{{{tenant.encode('utf-8').hex()}}}:"
    return TenantKeys(
        base + "rpm", base + "tpm", base + "day", base + "slots", base + "holds", base + "void"
    )
