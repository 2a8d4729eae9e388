"""Route kinds in the launch contract (spec §23): ``serve speech`` / ``serve diffusion``."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config import GatewayConfig, RouteKind
from gateway.upstream.launch import (
    UnsafeLaunchError,
    build_argv,
    build_plan,
    launch_plan_json,
    serve_identity,
)
from tests.upstream.test_launch import BUNDLE, FORBIDDEN, LAUNCH, make, recipe

ROUTE = f"/srv/mosaic-models/{BUNDLE}"


def _upstream(kind: str | None, **launch: Any) -> dict[str, Any]:
    route: Any = ROUTE if kind is None else {"route": ROUTE, "kind": kind}
    return {
        "name": "w",
        "base_url": "http://127.0.0.1:1234",
        "routes": [route],
        "launch": {**LAUNCH, **launch},
    }


def _plan(kind: str | None) -> dict[str, Any]:
    config = GatewayConfig.model_validate({"upstreams": [_upstream(kind)]})
    plan: dict[str, Any] = launch_plan_json(config)["upstreams"]["w"]
    return plan


def test_speech_route_launches_serve_speech_with_runtime_flags_before_it() -> None:
    assert _plan("speech")["argv"] == [
        "mistralrs",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "1234",
        "--no-ui",
        "--access-log-format",
        "json",
        "--max-seqs",
        "8",
        "--prefix-cache-n",
        "16",
        "speech",
        "-m",
        ROUTE,
        "--max-seq-len",
        "4096",
        "--max-batch-size",
        "1",
        "--cpu",
    ]


def test_image_route_launches_serve_diffusion() -> None:
    argv = _plan("image")["argv"]
    assert argv[argv.index("-m") - 1] == "diffusion"
    # Diffusion and speech models take no format, paged attention or multimodal flags.
    assert not {"--format", "--paged-attn", "--max-num-images", "--max-edge"} & set(argv)


@pytest.mark.parametrize("kind", [None, "chat", "embeddings"])
def test_chat_and_embeddings_routes_keep_todays_plan_and_identity(kind: str | None) -> None:
    plan = _plan(kind)
    assert plan == build_plan(make()).to_json()
    assert plan["serve_identity"] == recipe(LAUNCH)
    assert "speech" not in plan["argv"] and "diffusion" not in plan["argv"]


@pytest.mark.parametrize("kind", ["speech", "image"])
def test_a_media_kind_is_its_own_identity(kind: str) -> None:
    plan = _plan(kind)
    assert plan["launch"]["kind"] == kind
    assert plan["serve_identity"] == recipe({**LAUNCH, "kind": kind}) != recipe(LAUNCH)
    assert serve_identity(make(), kind="speech") != serve_identity(make(), kind="image")


@pytest.mark.parametrize("kind", ["speech", "image"])
@pytest.mark.parametrize("flag", FORBIDDEN[:4])
def test_media_plans_pass_the_denylist(kind: RouteKind, flag: str) -> None:
    assert flag not in build_argv(make(), kind=kind)


def test_media_routes_refuse_a_multi_model_or_quantized_launch() -> None:
    models = {
        "models": [
            {
                "model_public_id": "x",
                "model_revision": "r",
                "model_bundle_sha256": BUNDLE,
                "model_dir": ROUTE,
            }
        ]
    }
    multi = {k: v for k, v in LAUNCH.items() if not k.startswith("model_") and k != "format"}
    upstream = _upstream("speech")
    upstream["launch"] = {**multi, **models}
    with pytest.raises(ValidationError, match="one-model launch"):
        GatewayConfig.model_validate({"upstreams": [upstream]})
    with pytest.raises(ValidationError, match="format plain"):
        GatewayConfig.model_validate(
            {"upstreams": [_upstream("image", format="gguf", quantized_file="m.gguf")]}
        )
    with pytest.raises(UnsafeLaunchError):
        build_argv(make(format="gguf", quantized_file="m.gguf"), kind="speech")


def test_the_one_worker_shorthand_takes_a_route_with_a_kind() -> None:
    config = GatewayConfig.model_validate(
        {
            "upstream": {
                "base_url": "http://127.0.0.1:1234",
                "route": {"route": ROUTE, "kind": "image"},
                "launch": LAUNCH,
            }
        }
    )
    assert config.route_kinds == {ROUTE: "image"}
    assert "diffusion" in launch_plan_json(config)["argv"]
