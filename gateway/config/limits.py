"""How much the gateway lets through: :class:`AdmissionConfig` (weighted permits
and their queue), :class:`LimitsConfig` (gateway-wide ceilings a tenant policy
can only lower), and :class:`LimitsStoreConfig` (where tenant rate limits are
counted: this process, or a shared Redis).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.base import Model, PositiveInt


class AdmissionConfig(Model):
    """Weighted admission permits (spec section 7)."""

    capacity: PositiveInt = Field(
        8,
        description="Permit units in total (size it to the worker's --max-seqs).",
    )
    max_queue: Annotated[int, Field(ge=0)] = Field(
        64,
        description=(
            "Requests waiting for permits across all tenants; one more gets 429 queue_full."
        ),
    )


class LimitsConfig(Model):
    """Global ceilings; a tenant policy can only lower them."""

    max_body_bytes: PositiveInt = Field(
        1_048_576,
        description="Bytes of a JSON API request body (uploads are bounded by max_media_bytes).",
    )
    max_prompt_bytes: PositiveInt = Field(
        65_536,
        description="Bytes of everything the worker tokenizes or compiles in one request.",
    )
    max_media_parts: Annotated[int, Field(ge=0)] = Field(
        8,
        description="Media parts in one request.",
    )
    max_media_bytes: PositiveInt = Field(
        36_700_160,
        description=(
            "Bytes of the media of one request, and of one upload (data_url mode: x 4/3 must "
            "fit upstream.max_request_bytes)."
        ),
    )
    max_output_tokens: PositiveInt = Field(
        4096,
        description="Ceiling of max_tokens (a request without one gets this).",
    )
    max_json_depth: PositiveInt = Field(32, description="Nesting depth of a JSON request body.")
    max_embedding_inputs: PositiveInt = Field(
        256,
        description="Inputs in one embeddings request (spec section 14).",
    )


class LimitsStoreConfig(Model):
    """Where tenant rate limits live (spec §15): this process, or a shared Redis."""

    backend: Literal["memory", "redis"] = Field(
        "memory",
        description="memory: this process only; redis: shared by every replica.",
    )
    url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="redis:// or rediss:// URL (no password in it).",
    )
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = Field(
        None,
        description=(
            "Environment variable holding the Redis password (never the password itself)."
        ),
    )
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9:._-]{0,64}$")] = Field(
        "mrgw:",
        description="Prefix of every Redis key (one per environment).",
    )
    timeout_ms: Annotated[int, Field(ge=1, le=60_000)] = Field(
        250,
        description=(
            "Bound of each store call (connecting, and the whole script call); a batch of "
            "settlements gets one more per 64 scripts. A call past it fails that request "
            "(503 limits_unavailable under on_error: closed), not the replica's readiness."
        ),
    )
    unready_after_s: Annotated[float, Field(ge=0, le=3600)] = Field(
        5,
        description=(
            "/readyz reports limits_unavailable (on_error: closed) only once every store "
            "call and probe has failed for this long: one slow answer never takes a replica, "
            "nor a fleet on one Redis, out of its Service."
        ),
    )
    on_error: Literal["closed", "open"] = Field(
        "closed",
        description=(
            "Store unreachable or slow: closed answers 503 limits_unavailable; open serves "
            "unchecked."
        ),
    )
    lease_renew_s: Annotated[float, Field(ge=0.1, le=60)] = Field(
        5,
        description=(
            "A replica renews the concurrency slots of its running requests this often "
            "(one batched call)."
        ),
    )
    lease_ttl_s: Annotated[float, Field(gt=0, le=600)] = Field(
        15,
        description=(
            "A slot expires this long after its last renewal: a dead replica's slots are "
            "free within it."
        ),
    )

    @model_validator(mode="after")
    def _leases(self) -> LimitsStoreConfig:
        # A renewal may take up to timeout_ms: it must still land before the lease ends.
        if self.lease_renew_s + self.timeout_ms / 1000 >= self.lease_ttl_s:
            raise ValueError("lease_renew_s + timeout_ms must be less than lease_ttl_s")
        return self

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError("must be a redis:// or rediss:// URL with a host")
        if parts.password is not None:
            raise ValueError("must not carry a password (use password_env)")
        if parts.path not in ("", "/") and not re.fullmatch(r"/[0-9]{1,5}", parts.path):
            raise ValueError("path must be a database number, e.g. /0")
        if parts.query or parts.fragment:
            raise ValueError("must not carry a query or fragment")
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            raise ValueError("has an invalid port") from exc
        return value
