"""Route kinds, images, speech and the public base URL in the config (spec §23, §24)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import GatewayConfig, ImagesConfig, ServerConfig, SpeechConfig
from gateway.config.policy import Cost, TenantPolicy

A, B, C = ("/srv/m/" + c * 64 for c in "abc")


def _config(routes: list[Any], **more: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {"upstreams": [{"name": "w", "base_url": "http://127.0.0.1:1234", "routes": routes}]} | more
    )


def test_a_bare_route_is_chat_and_an_entry_names_its_kind() -> None:
    config = _config([A, {"route": B, "kind": "speech"}, {"route": C, "kind": "image"}])
    assert config.route_kinds == {A: "chat", B: "speech", C: "image"}
    assert list(config.routes) == [A, B, C]
    assert _config([{"route": A}]).route_kinds == {A: "chat"}


@pytest.mark.parametrize(
    "entry",
    [
        {"route": A, "kind": "video"},
        {"route": A, "kind": "chat", "extra": 1},
        {"kind": "speech"},
        {"route": "", "kind": "speech"},
    ],
)
def test_malformed_route_entries_are_refused(entry: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _config([entry])


def test_a_route_named_twice_is_refused_whatever_its_kinds() -> None:
    with pytest.raises(ValidationError, match="distinct"):
        _config([A, {"route": A, "kind": "speech"}])


def test_release_arms_must_share_a_kind() -> None:
    releases = [{"name": "r", "stable": A, "canary": B}]
    with pytest.raises(ValidationError, match="differ in kind"):
        _config([A, {"route": B, "kind": "image"}], releases=releases)
    assert _config([A, B], releases=releases).releases[0].name == "r"


def test_media_defaults_are_the_settled_ones() -> None:
    config = _config([A])
    assert config.images == ImagesConfig(
        max_n=4, max_side=1536, max_pixels=1_048_576, max_bytes=16_777_216, url_ttl_s=3600
    )
    assert config.speech == SpeechConfig(max_input_chars=4096, max_output_bytes=67_108_864)
    assert config.server.public_base_url is None
    assert (Cost().image_generation, Cost().speech) == (4, 2)
    policy = TenantPolicy.model_validate({"tenant": "t", "endpoints": ["images", "speech"]})
    assert policy.endpoints == ["images", "speech"]


@pytest.mark.parametrize(
    "bad",
    [{"max_side": 1000}, {"max_side": 32}, {"max_n": 0}, {"max_pixels": 10}, {"url_ttl_s": 0}],
)
def test_image_bounds_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        ImagesConfig.model_validate(bad)


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("https://gw.example.com", "https://gw.example.com"),
        ("https://gw.example.com/ai/", "https://gw.example.com/ai"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ],
)
def test_public_base_url(given: str, kept: str) -> None:
    assert ServerConfig(public_base_url=given).public_base_url == kept


@pytest.mark.parametrize(
    "bad", ["gw.example.com", "ftp://x", "https://gw/?a=1", "https://u:p@gw", "https:///x"]
)
def test_public_base_url_refuses_what_is_no_origin(bad: str) -> None:
    with pytest.raises(ValidationError):
        ServerConfig(public_base_url=bad)
