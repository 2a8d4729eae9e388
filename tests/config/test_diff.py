"""The SIGHUP warning's key list: two typed configs compared field by field."""

from __future__ import annotations

from typing import Any

from gateway.config import GatewayConfig
from gateway.config.diff import changed_keys


def _config(**sections: Any) -> GatewayConfig:
    data: dict[str, Any] = {
        "upstream": {"route": "/srv/models/x"},
        "auth": {
            "issuers": [
                {
                    "issuer": "https://a.test",
                    "audience": "gw",
                    "algorithms": ["HS256"],
                    "hs256_secret_env": "A_SECRET",
                },
                {
                    "issuer": "https://b.test",
                    "audience": "gw",
                    "algorithms": ["HS256"],
                    "hs256_secret_env": "B_SECRET",
                },
            ]
        },
    }
    for name, value in sections.items():
        data[name] = {**data.get(name, {}), **value}
    return GatewayConfig.model_validate(data)


def test_identical_configs_have_no_changes() -> None:
    assert changed_keys(_config(), _config()) == []


def test_leaves_are_named_by_dotted_path_in_field_order() -> None:
    old = _config()
    new = _config(limits={"max_body_bytes": 2048}, upstream={"idle_timeout_s": 5})
    assert changed_keys(old, new) == ["upstream.idle_timeout_s", "limits.max_body_bytes"]


def test_list_items_sections_and_lengths() -> None:
    old = _config()
    issuers = [dict(i) for i in old.model_dump()["auth"]["issuers"]]
    issuers[1]["leeway_s"] = 5
    assert changed_keys(old, _config(auth={"issuers": issuers})) == ["auth.issuers[1].leeway_s"]
    assert changed_keys(old, _config(auth={"issuers": issuers[:1]})) == ["auth.issuers"]
    tls = {"tls": {"certfile": "/x/tls.crt", "keyfile": "/x/tls.key"}}
    assert changed_keys(old, _config(listen=tls)) == ["listen.tls"]
    both = _config(listen={"tls": {"certfile": "/x/other.crt", "keyfile": "/x/tls.key"}})
    assert changed_keys(_config(listen=tls), both) == ["listen.tls.certfile"]


def test_values_never_appear() -> None:
    old = _config(cors={"allow_origins": ["https://one.example"]})
    new = _config(cors={"allow_origins": ["https://two.example"]})
    assert changed_keys(old, new) == ["cors.allow_origins[0]"]
