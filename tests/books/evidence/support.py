"""Builders shared by the evidence and state tests."""

from __future__ import annotations

from pathlib import Path

from gateway.config import LimitsConfig
from gateway.config.policy import (
    EvidencePolicy,
    Modality,
    PolicyLimits,
    Tenant,
    TenantPolicy,
    resolve_limits,
)

MEDIA_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "media"
REPO_ROOT = Path(__file__).resolve().parents[3]

ALL_MODALITIES: list[Modality] = ["text", "image", "audio", "video"]

#: a plausible "now" for fake clocks (unix seconds, with a fraction to truncate)
EPOCH = 1_700_000_000.25


def make_tenant(
    name: str = "acme",
    modalities: list[Modality] | None = None,
    max_media_bytes: int | None = None,
    *,
    evidence: EvidencePolicy | None = None,
) -> Tenant:
    policy = TenantPolicy(
        tenant=name,
        modalities=ALL_MODALITIES if modalities is None else modalities,
        limits=PolicyLimits(max_media_bytes=max_media_bytes),
        evidence=EvidencePolicy() if evidence is None else evidence,
    )
    return Tenant(name, policy, resolve_limits(policy.limits, LimitsConfig()))


def fixture_bytes(name: str) -> bytes:
    return (MEDIA_DIR / name).read_bytes()


class FakeClock:
    """A clock the test moves: catalogs and services take it as ``clock=``."""

    def __init__(self, now: float = EPOCH) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
