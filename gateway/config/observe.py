"""What the gateway records about itself: :class:`AuditConfig` (the receipts file
and its rotation), :class:`MetricsConfig` with its optional separate
:class:`MetricsListen` listener, and :class:`LoggingConfig` (the level of the
JSON log lines on stderr).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from gateway.config.base import Model, PositiveInt, RelPath


class AuditConfig(Model):
    """Receipts: one JSON line per authenticated inference request (spec sections 10 and 13)."""

    path: RelPath = Field(
        Path("receipts.jsonl"),
        description="Append-only JSON-lines receipts file.",
    )
    max_pending: PositiveInt = Field(
        100_000,
        description="Receipts kept in memory while the file cannot be written (spec section 13).",
    )
    flush_timeout_s: Annotated[float, Field(ge=0)] = Field(
        5,
        description="How long a drain waits for the writer.",
    )
    flush_interval_ms: Annotated[float, Field(ge=0, le=1000)] = Field(
        20,
        description=(
            "Receipts queued within this long of the first share one write and one fsync "
            "(a crash can lose this much more; 0: a batch per wakeup)."
        ),
    )
    rotate_bytes: Annotated[int, Field(ge=0)] = Field(
        0,
        description=(
            "Rotate to `<path>.1` ... `<path>.<keep>` before the file passes this size (0: off)."
        ),
    )
    keep: Annotated[int, Field(ge=0, le=1000)] = Field(10, description="Rotated files kept.")
    anchor_interval_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        10,
        description=(
            "Each replica records its receipt chain's head on disk (replica, seq, sha256) in "
            "the state store this often: `receipts verify --anchors` reports a chain shorter "
            "than its anchor as truncated (spec section 24)."
        ),
    )


class MetricsListen(Model):
    """A separate plain-HTTP listener for the metrics endpoint."""

    host: str = Field("0.0.0.0", description="Address to bind.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(9464, description="Port to bind.")


class MetricsConfig(Model):
    """Prometheus metrics."""

    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9/_-]*$")] = Field(
        "/metrics",
        description="Path of the metrics endpoint.",
    )
    listen: MetricsListen | None = Field(
        None,
        description=(
            "Serve metrics on this plain-HTTP listener instead of the main one (spec section 13)."
        ),
    )


class LoggingConfig(Model):
    """Logs: JSON lines on stderr."""

    level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Log level (the GATEWAY_LOG_LEVEL environment variable overrides it).",
    )
