"""Images and speech (spec §23, §24 "Details settled"): :class:`ImagesConfig`
(how many images, how large, how long a signed ``url`` lives), :class:`SpeechConfig`
(input and output bounds) and :class:`ServerConfig` (the gateway's public base URL,
which a signed ``url`` is built on).
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from gateway.config.base import Model, PositiveInt

#: the smallest side the gateway asks a diffusion worker for (spec §24)
MIN_IMAGE_SIDE = 64
#: sides are multiples of this (latent patches of the diffusion models)
IMAGE_SIDE_STEP = 16


class ImagesConfig(Model):
    """``POST /v1/images/generations`` (spec §23)."""

    max_n: Annotated[int, Field(ge=1, le=16)] = Field(
        4, description="Most images one request may ask for (`n`); each is one worker call."
    )
    max_side: Annotated[int, Field(ge=MIN_IMAGE_SIDE, le=16_384)] = Field(
        1536, description="Longest side of a requested image, in pixels (a multiple of 16)."
    )
    max_pixels: Annotated[int, Field(ge=MIN_IMAGE_SIDE * MIN_IMAGE_SIDE)] = Field(
        1_048_576, description="Most pixels (width x height) of a requested image."
    )
    max_bytes: PositiveInt = Field(
        16_777_216, description="Largest PNG the worker may answer with (decoded bytes)."
    )
    url_ttl_s: PositiveInt = Field(
        3600,
        description=(
            "How long a `response_format: url` link works without credentials (its `exp`)."
        ),
    )
    url_key_env: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")] | None = Field(
        None,
        description=(
            "Environment variable holding the key (>= 32 bytes) that signs `url` links; "
            "unset: a random key per process (links work only on the replica that made "
            "them, until it restarts)."
        ),
    )

    @field_validator("max_side")
    @classmethod
    def _step(cls, value: int) -> int:
        if value % IMAGE_SIDE_STEP:
            raise ValueError(f"must be a multiple of {IMAGE_SIDE_STEP}")
        return value


class SpeechConfig(Model):
    """``POST /v1/audio/speech`` (spec §23)."""

    max_input_chars: PositiveInt = Field(
        4096, description="Most characters of `input` (longer: 400 prompt_too_large)."
    )
    max_output_bytes: PositiveInt = Field(
        67_108_864,
        description="Largest audio body the worker may answer with (larger: refused, 502).",
    )


class ServerConfig(Model):
    """How callers reach this gateway from outside."""

    public_base_url: str | None = Field(
        None,
        description=(
            "The gateway's public origin (and path prefix, if any) as callers reach it, e.g. "
            "`https://gw.example.com`; signed image links are built on it (needed for "
            "`response_format: url`)."
        ),
    )

    @field_validator("public_base_url")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("must not carry a query, fragment or credentials")
        return value.rstrip("/")
