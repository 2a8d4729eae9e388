"""docs/reference.md and the JSON Schemas come from the models, and stay in step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from gateway import config as config_module
from gateway.config import GatewayConfig
from gateway.config import policy as policy_module
from gateway.config.policy import TenantPolicy
from gateway.tools.cli import main
from gateway.tools.docgen import SCHEMAS, render

REPO = Path(__file__).resolve().parents[2]
#: models whose fields need no description of their own (none today)
UNDESCRIBED: set[str] = set()


def test_reference_is_regenerated_from_the_models() -> None:
    committed = (REPO / "docs" / "reference.md").read_text()
    assert committed == render(), (
        "docs/reference.md is stale: python -m gateway.tools.docgen > docs/reference.md"
    )


def _leaf_keys(
    model: type[BaseModel], prefix: str = "", seen: set[type[BaseModel]] | None = None
) -> list[str]:
    """Every key, a model used in several places (upstream, upstreams[]) under
    the first (the reference lists it once, headed by all its places)."""
    seen = set() if seen is None else seen
    keys = []
    for name, info in model.model_fields.items():
        keys.append(f"{prefix}{name}")
        for nested in _models_in(info.annotation):
            if nested in seen:
                continue
            seen.add(nested)
            suffix = "[]" if "list[" in str(info.annotation) else ""
            keys += _leaf_keys(nested, f"{prefix}{name}{suffix}.", seen)
    return keys


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found = []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    for arg in getattr(annotation, "__args__", ()):
        found += _models_in(arg)
    return found


@pytest.mark.parametrize("model", [GatewayConfig, TenantPolicy])
def test_every_key_of_the_models_is_in_the_reference(model: type[BaseModel]) -> None:
    text = render()
    for key in _leaf_keys(model):
        assert f"| `{key}` |" in text, key


def test_every_field_has_a_description() -> None:
    missing = []
    checked = set()
    for module in (config_module, policy_module):
        for value in vars(module).values():
            # The config package re-exports the models of its subsystem modules.
            if (
                isinstance(value, type)
                and issubclass(value, BaseModel)
                and value.__module__.startswith(module.__name__)
                and value.__name__ not in UNDESCRIBED
            ):
                checked.add(value.__name__)
                missing += [
                    f"{value.__name__}.{name}"
                    for name, info in value.model_fields.items()
                    if not info.description
                ]
    assert {"GatewayConfig", "UpstreamConfig", "TenantPolicy"} <= checked
    assert missing == []


def test_defaults_and_requirements_are_the_models_own() -> None:
    text = render()
    assert "| `listen.port` | integer (>= 0, <= 65535) | `8443` |" in text
    assert '| `upstream.name` | string (matching `^[a-z0-9-]{1,32}$`) | `"default"` |' in text
    assert "### `upstream`, `upstreams[]` (UpstreamConfig)" in text
    assert "| `auth.issuers[].leeway_s` | number (>= 0) | `30` |" in text
    assert "| `tenant` | string (matching `^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`) | required |" in text


@pytest.mark.parametrize("which", list(SCHEMAS))
def test_schema_verb_prints_the_models_json_schema(
    which: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schema", which]) == 0
    printed = json.loads(capsys.readouterr().out)
    model, _ = SCHEMAS[which]
    assert printed == model.model_json_schema()
    assert printed["additionalProperties"] is False
