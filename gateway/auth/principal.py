"""Who a request is: the outcome of authentication, input to authorization."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    subject: str
    scopes: frozenset[str]
    kind: Literal["jwt", "api_key"]
    #: the token's ``exp`` (epoch seconds); None for static API keys
    expires_at: float | None
    #: the configured issuer that signed the token; None for static API keys
    issuer: str | None = None
