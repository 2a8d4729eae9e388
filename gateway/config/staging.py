"""Evidence staging (spec sections 5 and 13): :class:`StagingConfig`, where uploaded
media and their catalog are kept, how media reach the worker (data or file URLs),
and how many uploads are read at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gateway.config.base import Model, PositiveFloat, PositiveInt, RelPath


class StagingConfig(Model):
    """Evidence staging (spec sections 5 and 13)."""

    dir: RelPath = Field(
        Path("var/evidence"),
        description="Gateway-side evidence store (read-write); files are `<sha256>.<ext>`.",
    )
    catalog: RelPath = Field(
        Path("var/catalog.sqlite3"),
        description="SQLite catalog of the evidence records.",
    )
    worker_media: Literal["data_url", "file_url"] = Field(
        "data_url",
        description=(
            "How media reach the worker: data_url (every release) or file_url (worker <= 0.8.17)."
        ),
    )
    worker_url_prefix: str | None = Field(
        None,
        description="file_url only: the staging dir as the worker mounts it (`file:///...`).",
    )
    max_concurrent_uploads: PositiveInt = Field(
        4,
        description=(
            "Uploads read at once (each streams to a temp file); the next gets 429 queue_full."
        ),
    )
    max_image_pixels: PositiveInt = Field(
        40_000_000,
        description=(
            "Pixels an image (or a video frame) may declare in its header; past it an upload "
            "or inline data is 400 media_limit_exceeded (spec §24)."
        ),
    )
    max_image_side: PositiveInt = Field(
        16_384,
        description="Width or height an image (or a video frame) may declare, each.",
    )
    expiry_sweep_s: PositiveFloat = Field(
        30,
        description="How often records past a tenant's evidence.ttl_s are forgotten.",
    )

    @model_validator(mode="after")
    def _prefix_for_file_url(self) -> StagingConfig:
        prefix = self.worker_url_prefix or ""
        if self.worker_media == "file_url" and not prefix.startswith("file:///"):
            raise ValueError("file_url mode needs worker_url_prefix: file:///<dir>")
        return self
