"""Launch contract: argv rules, version gating, serve identity, config-level refusals."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.config import GatewayConfig, LaunchConfig
from gateway.config.loader import ConfigError, load_config
from gateway.upstream.launch import (
    UnsafeLaunchError,
    build_argv,
    build_plan,
    check_argv,
    launch_dict,
    launch_plan_json,
    serve_identity,
)

BUNDLE = "ab" * 32
OTHER_BUNDLE = "cd" * 32

# Every field spelt out, in the JSON types model_dump(mode="json") gives back.
LAUNCH: dict[str, Any] = {
    "version": "0.9.2",
    "binary_sha256": "12" * 32,
    "model_public_id": "google/gemma-3-4b-it",
    "model_revision": "0123456789abcdef0123456789abcdef01234567",
    "model_bundle_sha256": BUNDLE,
    "model_dir": f"/srv/mosaic-models/{BUNDLE}",
    "format": "plain",
    "port": 1234,
    "max_seqs": 8,
    "max_seq_len": 4096,
    "max_batch_size": 1,
    "paged_attn": "auto",
    "prefix_cache_n": 16,
    "max_num_images": 8,
    "max_edge": 1024,
    "device": "cpu",
}

# One different value per field; test_mutations_cover_every_field keeps this complete.
MUTATIONS: dict[str, Any] = {
    "version": "0.9.3",
    "binary_sha256": "34" * 32,
    "model_public_id": "google/gemma-3-12b-it",
    "model_revision": "fedcba9876543210fedcba9876543210fedcba98",
    "model_bundle_sha256": OTHER_BUNDLE,
    "model_dir": f"/srv/other-models/{BUNDLE}",
    "format": "gguf",
    "port": 1235,
    "max_seqs": 9,
    "max_seq_len": 8192,
    "max_batch_size": 2,
    "paged_attn": "off",
    "prefix_cache_n": 0,
    "max_num_images": 4,
    "max_edge": 512,
    "device": "cuda",
}

FORBIDDEN = [
    "--agent",
    "--agent-permission",
    "--enable-search",
    "--enable-code-execution",
    "--enable-shell",
    "--sandbox-image",
    "--search-embedding-model",
    "--code-exec-timeout",
    "--shell-path",
    "--skills-dir",
    "--mcp-port",
    "--mcp-config",
    "--enable-lora",
    "--lora",
    "--max-tool-rounds",
    "--tool-dispatch-url",
    "--log",
    "--log=/tmp/requests.log",
    "-l",
    "--ui",
]


def make(**overrides: Any) -> LaunchConfig:
    return LaunchConfig.model_validate({**LAUNCH, **overrides})


def recipe(launch: dict[str, Any]) -> str:
    text = json.dumps(launch, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def pairs(argv: list[str]) -> list[tuple[str, str]]:
    return list(itertools.pairwise(argv))


# --- argv -----------------------------------------------------------------------


def test_argv_golden_cpu_0_9_2() -> None:
    assert build_argv(make()) == [
        "mistralrs",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "1234",
        "--no-ui",
        "--access-log-format",
        "json",
        "-m",
        f"/srv/mosaic-models/{BUNDLE}",
        "--format",
        "plain",
        "--max-seqs",
        "8",
        "--max-seq-len",
        "4096",
        "--max-batch-size",
        "1",
        "--paged-attn",
        "auto",
        "--prefix-cache-n",
        "16",
        "--max-num-images",
        "8",
        "--max-edge",
        "1024",
        "--cpu",
    ]


@pytest.mark.parametrize("version", ["0.8.2", "0.8.17", "0.8.18", "0.9.0", "0.9.2", "0.10.0"])
@pytest.mark.parametrize("device", ["cpu", "cuda", "metal"])
def test_argv_always_loopback_and_no_ui(version: str, device: str) -> None:
    argv = build_argv(make(version=version, device=device))
    assert argv[:2] == ["mistralrs", "serve"]
    assert ("--host", "127.0.0.1") in pairs(argv)
    assert argv.count("--host") == 1
    assert "--no-ui" in argv
    assert ("--port", "1234") in pairs(argv)
    assert ("-m", f"/srv/mosaic-models/{BUNDLE}") in pairs(argv)
    assert all(isinstance(token, str) for token in argv)


@pytest.mark.parametrize(
    ("version", "json_logs"),
    [
        ("0.8.2", False),
        ("0.8.12", False),
        ("0.8.99", False),
        ("0.9.0", True),
        ("0.9.2", True),
        ("0.10.0", True),  # numeric, not string, comparison
        ("1.0.0", True),
    ],
)
def test_access_log_format_json_from_0_9_0(version: str, json_logs: bool) -> None:
    argv = build_argv(make(version=version))
    assert (("--access-log-format", "json") in pairs(argv)) is json_logs
    assert ("--access-log-format" in argv) is json_logs


@pytest.mark.parametrize(("device", "flag"), [("cpu", True), ("cuda", False), ("metal", False)])
def test_device_flag(device: str, flag: bool) -> None:
    argv = build_argv(make(device=device))
    assert ("--cpu" in argv) is flag
    assert not any(t.startswith("--device") for t in argv)


@pytest.mark.parametrize("version", ["0.8.1", "0.7.9", "0.0.1"])
def test_versions_without_a_known_serve_contract_are_refused(version: str) -> None:
    launch = make(version=version)
    with pytest.raises(ValueError, match=r"older than 0\.8\.2"):
        build_argv(launch)
    # The identity is still defined: receipts never depend on the argv rules.
    assert len(serve_identity(launch)) == 64


def test_relative_model_dir_is_refused() -> None:
    # A relative path is one mistral.rs would read as a hub id: refused at load.
    with pytest.raises(ValueError, match="absolute"):
        make(model_dir=f"models/{BUNDLE}")


def test_argv_follows_each_runtime_field() -> None:
    argv = build_argv(
        make(
            **{**MUTATIONS, "model_bundle_sha256": BUNDLE, "version": "0.9.2"},
            quantized_file="model-q4.gguf",
        )
    )
    for flag, value in [
        ("--port", "1235"),
        ("-m", f"/srv/other-models/{BUNDLE}"),
        ("--format", "gguf"),
        ("-f", "model-q4.gguf"),
        ("--max-seqs", "9"),
        ("--max-seq-len", "8192"),
        ("--max-batch-size", "2"),
        ("--paged-attn", "off"),
        ("--prefix-cache-n", "0"),
        ("--max-num-images", "4"),
        ("--max-edge", "512"),
    ]:
        assert (flag, value) in pairs(argv)
    assert "--cpu" not in argv


def _all_plans() -> list[list[str]]:
    combos = itertools.product(
        ["0.8.2", "0.8.17", "0.9.0", "0.9.2", "1.2.3"],
        ["plain", "gguf", "ggml"],
        ["auto", "on", "off"],
        ["cpu", "cuda", "metal"],
    )
    return [
        build_argv(
            make(
                version=v,
                format=f,
                paged_attn=p,
                device=d,
                **({"quantized_file": f"model.{f}"} if f != "plain" else {}),
            )
        )
        for v, f, p, d in combos
    ]


def test_no_forbidden_flag_in_any_plan() -> None:
    for argv in _all_plans():
        for token in argv:
            name = token.split("=", 1)[0]
            assert name not in FORBIDDEN
            assert not name.startswith(("--agent", "--enable-", "--mcp", "--lora", "--sandbox"))
            assert name not in ("--max-tool-rounds", "--tool-dispatch-url", "--log", "-l")


@pytest.mark.parametrize("flag", FORBIDDEN)
def test_denylist_refuses_forbidden_flags(flag: str) -> None:
    argv = build_argv(make())
    with pytest.raises(UnsafeLaunchError):
        check_argv([*argv, flag])
    with pytest.raises(UnsafeLaunchError):
        check_argv([*argv[:2], flag, *argv[2:]])


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: [t if t != "127.0.0.1" else "0.0.0.0" for t in a],
        lambda a: [*a, "--host", "127.0.0.1"],
        lambda a: [*a, "--host=0.0.0.0"],
        lambda a: [t for t in a if t != "--no-ui"],
        lambda a: ["mistralrs", "run", *a[2:]],
        lambda a: ["/bin/sh", *a[1:]],
    ],
)
def test_check_argv_refuses_broken_invariants(edit: Any) -> None:
    with pytest.raises(UnsafeLaunchError):
        check_argv(edit(build_argv(make())))


def test_unsafe_launch_error_is_a_value_error() -> None:
    assert issubclass(UnsafeLaunchError, ValueError)


# --- version ordering ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "minimum", "expected"),
    [
        ("0.9.0", (0, 9, 0), True),
        ("0.8.99", (0, 9, 0), False),
        ("0.10.0", (0, 9, 0), True),
        ("1.0.0", (0, 9, 9), True),
        ("0.9.1", (0, 9, 2), False),
        ("10.0.0", (9, 99, 99), True),
    ],
)
def test_versions_compare_numerically(
    version: str, minimum: tuple[int, int, int], expected: bool
) -> None:
    assert (make(version=version).version_tuple() >= minimum) is expected


@pytest.mark.parametrize("bad", ["latest", "0.9", "v0.9.2", "0.9.2-rc1", "", "0.9.x"])
def test_malformed_versions_are_refused_at_load(bad: str) -> None:
    with pytest.raises(ValidationError, match="version"):
        make(version=bad)


# --- serve identity -----------------------------------------------------------------


#: fields a one-model launch leaves unset (multi-model, gguf/ggml and extra_args fields)
OPTIONAL = {"quantized_file", "models", "config_path", "extra_args"}


def test_mutations_cover_every_field() -> None:
    assert set(MUTATIONS) == set(LaunchConfig.model_fields) - OPTIONAL == set(LAUNCH)
    for name, value in MUTATIONS.items():
        assert value != LAUNCH[name], name


def test_identity_is_the_spec_recipe() -> None:
    plan = build_plan(make())
    assert plan.launch == LAUNCH
    assert plan.serve_identity == recipe(LAUNCH)


def test_identity_escapes_non_ascii_like_the_recipe() -> None:
    launch = make(model_public_id="équipe/modèle-β")
    raw = json.dumps(
        launch.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    assert serve_identity(launch) == recipe({**LAUNCH, "model_public_id": "équipe/modèle-β"})
    assert serve_identity(launch) != hashlib.sha256(raw.encode()).hexdigest()


def test_identity_is_stable_for_equal_contracts() -> None:
    required = (
        "version",
        "binary_sha256",
        "model_public_id",
        "model_revision",
        "model_bundle_sha256",
        "model_dir",
    )
    reordered = LaunchConfig.model_validate(dict(reversed(LAUNCH.items())))
    # LAUNCH spells out the config defaults, and defaults are part of the canonical object.
    defaults_omitted = LaunchConfig.model_validate({k: LAUNCH[k] for k in required})
    identities = {serve_identity(c) for c in (make(), make(), reordered, defaults_omitted)}
    assert identities == {recipe(LAUNCH)}


@pytest.mark.parametrize("field", sorted(LAUNCH))
def test_identity_changes_when_any_single_field_changes(field: str) -> None:
    base = make()
    # model_copy changes exactly one field (a validated change of the bundle
    # digest needs model_dir to follow; that pair is checked below).
    changed = base.model_copy(update={field: MUTATIONS[field]})
    assert launch_dict(changed) == {**LAUNCH, field: MUTATIONS[field]}
    assert serve_identity(changed) != serve_identity(base)
    assert serve_identity(changed) == recipe({**LAUNCH, field: MUTATIONS[field]})


def test_identity_changes_with_a_validated_new_bundle() -> None:
    moved = make(model_bundle_sha256=OTHER_BUNDLE, model_dir=f"/srv/mosaic-models/{OTHER_BUNDLE}")
    assert serve_identity(moved) != serve_identity(make())


# --- plan JSON and launch_plan_json ---------------------------------------------------


def test_plan_to_json_shape() -> None:
    plan = build_plan(make())
    out = plan.to_json()
    assert set(out) == {"argv", "serve_identity", "launch"}
    assert out["argv"] == plan.argv
    assert len(out["serve_identity"]) == 64
    assert all(c in "0123456789abcdef" for c in out["serve_identity"])
    assert out["launch"] == LAUNCH
    assert json.loads(json.dumps(out)) == out
    out["argv"].append("--agent")
    out["launch"]["port"] = 1
    assert "--agent" not in plan.argv
    assert plan.launch["port"] == 1234


def _config(launch: dict[str, Any] | None) -> GatewayConfig:
    upstream: dict[str, Any] = {
        "base_url": "http://127.0.0.1:1234",
        "route": f"/srv/mosaic-models/{BUNDLE}",
    }
    if launch is not None:
        upstream["launch"] = launch
    return GatewayConfig.model_validate({"upstream": upstream})


def test_launch_plan_json_without_launch() -> None:
    with pytest.raises(ValueError, match=r"^upstream\.launch is not configured$"):
        launch_plan_json(_config(None))


def test_launch_plan_json_with_launch() -> None:
    out = launch_plan_json(_config(LAUNCH))
    assert out == build_plan(make()).to_json()
    assert out["serve_identity"] == recipe(LAUNCH)


# --- config-level refusals (the loader, before any plan is built) --------------------


def _write(tmp_path: Path, launch: dict[str, Any], **upstream: Any) -> Path:
    data = {
        "upstream": {
            "base_url": "http://127.0.0.1:1234",
            "route": f"/srv/mosaic-models/{BUNDLE}",
            **upstream,
            "launch": launch,
        }
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_valid_config_loads(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, LAUNCH))
    assert config.workers[0].launch == make()


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"version": "latest"}, "upstream.launch.version"),
        ({"version": "0.9"}, "upstream.launch.version"),
        ({"version": "v0.9.2"}, "upstream.launch.version"),
        ({"binary_sha256": "AB" * 32}, "upstream.launch.binary_sha256"),
        ({"binary_sha256": "ab" * 31}, "upstream.launch.binary_sha256"),
        ({"binary_sha256": "zz" * 32}, "upstream.launch.binary_sha256"),
        ({"model_bundle_sha256": "ab" * 33}, "upstream.launch.model_bundle_sha256"),
        ({"model_dir": "/srv/mosaic-models/gemma"}, "upstream.launch"),
        ({"format": "safetensors"}, "upstream.launch.format"),
        ({"paged_attn": "yes"}, "upstream.launch.paged_attn"),
        ({"device": "rocm"}, "upstream.launch.device"),
        ({"agent": True}, "upstream.launch.agent"),
    ],
)
def test_bad_launch_fields_fail_loading(tmp_path: Path, change: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, {**LAUNCH, **change}))
    assert any(key in error for error in info.value.errors), info.value.errors


def test_model_dir_must_end_in_the_bundle_digest(tmp_path: Path) -> None:
    launch = {**LAUNCH, "model_dir": f"/srv/mosaic-models/{OTHER_BUNDLE}"}
    with pytest.raises(ConfigError, match="model_bundle_sha256"):
        load_config(_write(tmp_path, launch, route=f"/srv/mosaic-models/{OTHER_BUNDLE}"))


def test_launch_port_must_equal_base_url_port(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="port"):
        load_config(_write(tmp_path, {**LAUNCH, "port": 1235}))
    with pytest.raises(ConfigError, match="port"):
        load_config(_write(tmp_path, LAUNCH, base_url="http://127.0.0.1:8080"))


def test_model_dir_must_equal_route(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="route"):
        load_config(_write(tmp_path, LAUNCH, route=f"/srv/elsewhere/{BUNDLE}"))


def test_fields_of_the_other_launch_form_are_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="config_path is for a multi-model launch"):
        make(config_path="/etc/mistralrs/models.toml")
    one = {
        "model_public_id": "org/m",
        "model_revision": "r1",
        "model_bundle_sha256": OTHER_BUNDLE,
        "model_dir": f"/srv/mosaic-models/{OTHER_BUNDLE}",
    }
    several = {k: v for k, v in LAUNCH.items() if not k.startswith("model_")}
    with pytest.raises(ValueError, match="give each model its format"):
        LaunchConfig.model_validate({**several, "models": [one], "format": "gguf"})
    assert LaunchConfig.model_validate({**several, "models": [one]}).model_dirs == [
        one["model_dir"]
    ]
