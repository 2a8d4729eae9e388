"""policies-generator: the kustomize generator config written from a policies directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config.loader import policy_files
from gateway.tools.cli import main
from gateway.tools.kustomize import POLICIES_CONFIG_MAP, GeneratorError, policies_generator


def tree(root: Path, *names: str) -> Path:
    policies = root / "policies"
    policies.mkdir(parents=True)
    for name in names:
        (policies / name).write_text(f"tenant: {Path(name).stem}\n")
    return policies


def test_lists_what_the_loader_loads_in_load_order(tmp_path: Path) -> None:
    policies = tree(tmp_path, "zeta.yaml", "acme.yaml", "beta.yml", "README.md", "notes.txt")
    (policies / "sub").mkdir()
    (policies / "sub" / "nested.yaml").write_text("tenant: nested\n")
    doc = yaml.safe_load(policies_generator(policies, tmp_path))
    assert doc == {
        "apiVersion": "builtin",
        "kind": "ConfigMapGenerator",
        "metadata": {"name": POLICIES_CONFIG_MAP},
        "files": ["policies/acme.yaml", "policies/beta.yml", "policies/zeta.yaml"],
        "options": {"disableNameSuffixHash": True},
    }
    assert [f"policies/{p.name}" for p in policy_files(policies)] == doc["files"]


def test_output_is_a_function_of_the_listing(tmp_path: Path) -> None:
    policies = tree(tmp_path, "b.yaml", "a.yaml")
    first = policies_generator(policies, tmp_path)
    (policies / "a.yaml").write_text("tenant: a\nendpoints: [models]\n")  # content is not listed
    assert policies_generator(policies, tmp_path) == first
    assert policies_generator(policies, tmp_path, "other") != first
    (policies / "c.yaml").write_text("tenant: c\n")
    assert "policies/c.yaml" in policies_generator(policies, tmp_path)
    assert first.startswith("# GENERATED") and first.endswith("\n")


def test_paths_are_relative_to_the_kustomization_root(tmp_path: Path) -> None:
    policies = tree(tmp_path / "deploy" / "tenants dir", "acme.yaml")
    text = policies_generator(policies, tmp_path / "deploy")
    assert '"tenants dir/policies/acme.yaml"' in text  # quoted: a space would be misread
    assert yaml.safe_load(text)["files"] == ["tenants dir/policies/acme.yaml"]


def test_refuses_what_kustomize_or_the_gateway_would(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(GeneratorError, match="no tenant policy files"):
        policies_generator(empty, tmp_path)
    with pytest.raises(GeneratorError, match="not a directory"):
        policies_generator(tmp_path / "missing", tmp_path)
    outside = tree(tmp_path / "elsewhere", "acme.yaml")
    with pytest.raises(GeneratorError, match="not in or below"):
        policies_generator(outside, tmp_path / "deploy")
    bad = tree(tmp_path / "bad", "a b.yaml")
    with pytest.raises(GeneratorError, match="not a valid ConfigMap key"):
        policies_generator(bad, tmp_path / "bad")


def test_cli_writes_then_checks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policies = tree(tmp_path, "acme.yaml")
    out = tmp_path / "policies-generator.yaml"
    assert main(["policies-generator", str(policies), "--output", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["files"] == ["policies/acme.yaml"]
    assert not list(tmp_path.glob(".*partial"))
    assert main(["policies-generator", str(policies), "--check", str(out)]) == 0
    assert "matches" in capsys.readouterr().out

    (policies / "globex.yaml").write_text("tenant: globex\n")  # a tenant added, list not redone
    assert main(["policies-generator", str(policies), "--check", str(out)]) == 1
    err = capsys.readouterr().err
    assert "does not match" in err and "--output" in err
    assert main(["policies-generator", str(policies), "--check", str(tmp_path / "nope")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_cli_prints_to_stdout_relative_to_the_parent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = tree(tmp_path, "acme.yaml")
    assert main(["policies-generator", str(policies)]) == 0
    assert capsys.readouterr().out == policies_generator(policies, tmp_path)
    assert main(["policies-generator", str(tmp_path / "nothing")]) == 1
    assert capsys.readouterr().err.startswith("error: ")
