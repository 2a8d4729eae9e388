"""Weighted admission permits with weighted fair queuing (spec §7, §16).

A request waits here for the permit units its weight needs on its upstream,
in fair shares between tenants, and holds them until its stream ends.
``core`` is the pure scheduler (:class:`FairQueueCore`, tickets, weights);
``pools`` is its asyncio face (:class:`Admission` per upstream,
:class:`AdmissionGroup` across them, :class:`Permit`). Each module opens
with its theory of operation.

layer: may import gateway.config, gateway.core, gateway.types
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gateway.admission.core import FairQueueCore, Ticket, TicketState, request_weight

if TYPE_CHECKING:
    from gateway.admission.pools import Admission, AdmissionGroup, Permit

# The pools load asyncio; importing the pure core through this package must not.
_POOLS = frozenset({"Admission", "AdmissionGroup", "Permit"})


def __getattr__(name: str) -> Any:
    if name not in _POOLS:
        raise AttributeError(name)
    return getattr(importlib.import_module("gateway.admission.pools"), name)


__all__ = [
    "Admission",
    "AdmissionGroup",
    "FairQueueCore",
    "Permit",
    "Ticket",
    "TicketState",
    "request_weight",
]
