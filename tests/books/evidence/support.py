"""Builders shared by the evidence tests."""

from __future__ import annotations

from pathlib import Path

from gateway.config import LimitsConfig
from gateway.config.policy import Modality, PolicyLimits, Tenant, TenantPolicy, resolve_limits

MEDIA_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "media"
REPO_ROOT = Path(__file__).resolve().parents[3]

ALL_MODALITIES: list[Modality] = ["text", "image", "audio", "video"]


def make_tenant(
    name: str = "acme",
    modalities: list[Modality] | None = None,
    max_media_bytes: int | None = None,
) -> Tenant:
    policy = TenantPolicy(
        tenant=name,
        modalities=ALL_MODALITIES if modalities is None else modalities,
        limits=PolicyLimits(max_media_bytes=max_media_bytes),
    )
    return Tenant(name, policy, resolve_limits(policy.limits, LimitsConfig()))


def fixture_bytes(name: str) -> bytes:
    return (MEDIA_DIR / name).read_bytes()
