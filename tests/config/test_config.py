"""Config rules that guard the deployment (pure: pydantic models, no files)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.config import ListenConfig, UpstreamConfig, is_loopback_host

ROUTE = "/srv/mosaic-models/" + "0" * 64


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:1234", "http://127.9.9.9:1", "http://[::1]:1234", "http://localhost:1234"],
)
def test_loopback_worker_urls_are_accepted(url: str) -> None:
    assert UpstreamConfig(base_url=url, route=ROUTE).base_url == url


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.5:1234",
        "http://worker.internal:1234",
        "http://0.0.0.0:1234",
        "http://169.254.169.254/",
        "http://127.0.0.1.nip.io:1234",
    ],
)
def test_remote_worker_urls_need_allow_remote(url: str) -> None:
    with pytest.raises(ValidationError, match="loopback"):
        UpstreamConfig(base_url=url, route=ROUTE)
    assert UpstreamConfig(base_url=url, route=ROUTE, allow_remote=True).allow_remote


def test_is_loopback_host() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1")
    assert not is_loopback_host("") and not is_loopback_host("example.com")


def test_listen_limits_have_safe_defaults_and_bounds() -> None:
    listen = ListenConfig()
    assert (listen.header_timeout_s, listen.body_timeout_s, listen.max_header_bytes) == (
        10,
        30,
        32_768,
    )
    for bad in ({"header_timeout_s": 0}, {"body_timeout_s": -1}, {"max_header_bytes": 100}):
        with pytest.raises(ValidationError):
            ListenConfig.model_validate(bad)
    with pytest.raises(ValidationError, match="Extra inputs"):
        ListenConfig.model_validate({"header_timeout": 5})
