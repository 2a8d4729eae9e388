"""Responses API bookkeeping (spec section 14): :class:`ResponsesConfig`, how long
the gateway remembers which tenant a relayed Responses id belongs to.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gateway.config.base import Model


class ResponsesConfig(Model):
    """Responses API bookkeeping (spec section 14)."""

    ttl_s: Annotated[int, Field(ge=1, le=31_536_000)] = Field(
        86_400,
        description=(
            "How long a relayed Responses id stays the tenant's (previous_response_id, GET, "
            "DELETE); at most a year."
        ),
    )
