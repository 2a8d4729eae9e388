"""Where one request's time went (spec §20): measured where each stage starts
and ends, never estimated.

Stages (milliseconds in the receipt's ``timings_ms``, seconds in
``gateway_stage_seconds{stage}``; null when the stage did not run):
``auth`` the credential check; ``plan`` authorization, the body read (at the
caller's pace) and planning up to the resolved route; ``limits`` the rate
reservation; ``admission`` the permit wait; ``media`` catalog leases, inline
staging and evidence read/encode; ``upstream_head`` from sending the request
to the worker's response head; ``first_token`` from sending the request to
the first content event relayed; ``total`` from the request's arrival to its
end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

STAGES = (
    "auth",
    "plan",
    "limits",
    "admission",
    "media",
    "upstream_head",
    "first_token",
    "total",
)


@dataclass(slots=True)
class Timings:
    #: monotonic seconds of the request's arrival (RequestInfo.started)
    started: float
    auth: float | None = None
    plan: float | None = None
    limits: float | None = None
    admission: float | None = None
    media: float | None = None
    #: monotonic seconds when the request to the worker began, and its head came
    sent_at: float | None = None
    head_at: float | None = None

    def add_media(self, seconds: float) -> None:
        self.media = (self.media or 0.0) + seconds

    def stages(self, first_content_at: float | None, ended_at: float) -> dict[str, float | None]:
        """Seconds per stage, in :data:`STAGES` order."""
        sent = self.sent_at
        return {
            "auth": self.auth,
            "plan": self.plan,
            "limits": self.limits,
            "admission": self.admission,
            "media": self.media,
            "upstream_head": (
                self.head_at - sent if sent is not None and self.head_at is not None else None
            ),
            "first_token": (
                first_content_at - sent
                if sent is not None and first_content_at is not None
                else None
            ),
            "total": ended_at - self.started,
        }


def ms(seconds: float) -> float:
    """Milliseconds to 3 decimals, for a duration (>= 0): a quarter of
    ``round(x, 3)``'s cost, which a dozen calls per request showed in the profile."""
    return int(seconds * 1_000_000 + 0.5) / 1000


def as_ms(stages: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else ms(v) for k, v in stages.items()}


def now() -> float:
    return time.monotonic()
