"""Releases (spec §18): :class:`ReleaseConfig`, a policy alias naming two routes
(stable and canary) with a sticky cohort split, a fallback and a gate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gateway.config.base import Model, PositiveFloat, PositiveInt

RELEASE_NAME = r"^[a-z0-9-]{1,32}$"
#: what a policy alias names to mean a release rather than one route
RELEASE_PREFIX = "release:"


class GateConfig(Model):
    """When the canary rolls itself back (judged on this replica's window)."""

    window_s: PositiveFloat = Field(300, description="The window both arms are judged on.")
    min_requests: PositiveInt = Field(
        20, description="Requests per arm in the window before the gate judges."
    )
    max_failure_rate_delta: Annotated[float, Field(ge=0, le=1)] = Field(
        0.05, description="Canary failure rate minus stable failure rate, at most."
    )
    max_ttft_p95_ratio: Annotated[float, Field(ge=1)] = Field(
        2.0, description="Canary TTFT p95 over stable TTFT p95, at most."
    )


class ReleaseConfig(Model):
    """One release: a stable and a canary route behind one name (spec §18)."""

    name: Annotated[str, Field(pattern=RELEASE_NAME)] = Field(
        description='Policies map an alias to "release:<name>".'
    )
    stable: str = Field(description="The route serving everyone not in the canary's cohorts.")
    canary: str = Field(description="The new release's route (any upstream).")
    canary_percent: Annotated[float, Field(ge=0, le=100)] = Field(
        0, description="Share of cohorts sent to the canary, 0-100."
    )
    cohort: Literal["subject", "tenant", "request"] = Field(
        "subject",
        description="The sticky key: subject (tenant + sub), tenant, or request (no stickiness).",
    )
    fallback: bool = Field(
        True,
        description="One retry on the other arm for a failure before any byte reached the caller.",
    )
    gate: GateConfig | None = Field(None, description="Automatic rollback; none: manual only.")

    @model_validator(mode="after")
    def _two_routes(self) -> ReleaseConfig:
        if self.stable == self.canary:
            raise ValueError("stable and canary must be different routes")
        return self
