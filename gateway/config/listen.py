"""The callers' side of the listener: :class:`ListenConfig` (bind address, the
timeouts and size caps against hostile clients), its :class:`TLSConfig`, and the
exact-origin :class:`CorsConfig` for browser callers.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator

from gateway.config.base import Model, RelPath


class TLSConfig(Model):
    """TLS on the listener; omit the section for plain HTTP (loopback and tests only)."""

    certfile: RelPath = Field(description="Server certificate chain (PEM).")
    keyfile: RelPath = Field(description="Private key of the certificate (PEM, unencrypted).")
    client_ca: RelPath | None = Field(
        None,
        description=(
            "CA bundle (PEM); when set, every client must present a certificate it issued (mTLS)."
        ),
    )


class ListenConfig(Model):
    """The callers' listener."""

    host: str = Field("0.0.0.0", description="Address to bind.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        8443,
        description="Port to bind (0: the OS chooses; `serve` prints the one chosen).",
    )
    tls: TLSConfig | None = Field(None, description="TLS settings; absent: plain HTTP.")
    shutdown_grace_s: Annotated[float, Field(ge=0)] = Field(
        30,
        description="SIGTERM: how long requests in flight may finish before they are ended.",
    )
    # Not in the spec's example (added for hostile clients, see docs/security.md):
    # a request head must arrive within header_timeout_s of its first byte (or of
    # the connection), a body within body_timeout_s of its head.
    header_timeout_s: Annotated[float, Field(gt=0, le=300)] = Field(
        10,
        description=(
            "A request head must be complete this long after its first byte (or the "
            "connection); else 408."
        ),
    )
    body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        30,
        description="A request body must be complete this long after its head; else 408.",
    )
    max_header_bytes: Annotated[int, Field(ge=4096, le=1_048_576)] = Field(
        32_768,
        description="Cap on the request line plus headers; more is 431.",
    )


_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


class CorsConfig(Model):
    """Browser origins allowed to call (exact matches only)."""

    allow_origins: list[str] = Field(
        [],
        description="Exact origins scheme://host[:port]; empty: no CORS headers at all.",
    )
    max_age_s: Annotated[int, Field(ge=0)] = Field(
        600,
        description="access-control-max-age of preflight answers.",
    )

    @field_validator("allow_origins")
    @classmethod
    def _exact(cls, value: list[str]) -> list[str]:
        bad = [o for o in value if not _ORIGIN.match(o)]
        if bad:
            raise ValueError("each origin must be exact scheme://host[:port] (no '*', no path)")
        return value
