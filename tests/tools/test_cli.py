"""The command line: check, token, launch-plan, serve refusing a bad config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

from gateway.tools.cli import main

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "config"


def test_check_summarises_every_tenant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(FIXTURES / "gateway.yaml")]) == 0
    out = capsys.readouterr().out
    assert "tenant acme:" in out and "tenant globex:" in out
    assert "max_output_tokens=512" in out


def test_check_names_each_routes_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(FIXTURES.parent / "keys", tmp_path / "keys")
    config = (FIXTURES / "gateway.yaml").read_text().replace("../../policies", "../policies")
    route = "/srv/mosaic-models/b30e5a82b8aa61ebb10bf9e1f432983776af141dcabe19cb431a6e8572e1a139"
    config = config.replace(f"route: {route}", f"route: {{route: {route}, kind: speech}}")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "gateway.yaml").write_text(config)
    shutil.copytree(FIXTURES.parents[1] / "policies", tmp_path / "policies")
    assert main(["check", "--config", str(tmp_path / "cfg" / "gateway.yaml")]) == 0
    assert f"routes [{route} (speech)]" in capsys.readouterr().out


def test_check_lists_every_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(FIXTURES / "broken.yaml")]) == 1
    err = capsys.readouterr().err
    for fragment in ("listen.hots", "admision", "idle_timeout_s", "algorithms"):
        assert fragment in err, fragment
    assert err.count("broken.yaml") >= 4


def test_check_reports_every_bad_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copytree(FIXTURES.parent / "keys", tmp_path / "keys")
    config = (FIXTURES / "gateway.yaml").read_text().replace("../../policies", "policies")
    config = config.replace("../keys/", "keys/")
    (tmp_path / "gateway.yaml").write_text(config)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "acme.yaml").write_text("tenant: acme\nmodles: {}\n")
    (tmp_path / "policies" / "beta.yaml").write_text(
        "tenant: gamma\nlimits: {max_output_tokens: 99999}\n"
    )
    assert main(["check", "--config", str(tmp_path / "gateway.yaml")]) == 1
    err = capsys.readouterr().err
    assert "acme.yaml: modles" in err
    assert "beta.yaml: tenant" in err
    assert "beta.yaml: limits.max_output_tokens" in err


def test_check_names_policy_mistakes_beside_the_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broken config does not hide a broken policy: both in one run."""
    shutil.copytree(FIXTURES.parent / "keys", tmp_path / "keys")
    config = (FIXTURES / "gateway.yaml").read_text().replace("../../policies", "policies")
    config = config.replace("../keys/", "keys/").replace("admission:", "admision:", 1)
    (tmp_path / "gateway.yaml").write_text(config)
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "acme.yaml").write_text("tenant: acme\nmodles: {}\n")
    assert main(["check", "--config", str(tmp_path / "gateway.yaml")]) == 1
    err = capsys.readouterr().err
    assert "gateway.yaml: admision" in err
    assert "acme.yaml: modles" in err


def test_token_prints_only_a_jwt(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["token", "--config", str(FIXTURES / "gateway.yaml"), "--tenant", "acme"]) == 0
    token = capsys.readouterr().out.strip()
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["tenant"] == "acme" and claims["iss"] == "https://dev.gateway.local"
    assert set(claims["scope"].split()) == {"inference", "evidence"}


def test_launch_plan_without_launch_block(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["launch-plan", "--config", str(FIXTURES / "gateway.yaml")]) == 1
    assert "not configured" in capsys.readouterr().err


def test_serve_refuses_an_invalid_config() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.tools.cli",
            "serve",
            "--config",
            str(FIXTURES / "broken.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "configuration is invalid" in result.stderr
    assert "listening" not in result.stdout


def test_launch_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    config = yaml.safe_load((FIXTURES / "gateway.yaml").read_text())
    route = config["upstream"]["route"]
    config["upstream"]["launch"] = {
        "version": "0.9.2",
        "binary_sha256": "a" * 64,
        "model_public_id": "org/model",
        "model_revision": "b" * 40,
        "model_bundle_sha256": route.rsplit("/", 1)[1],
        "model_dir": route,
        "port": 1234,
    }
    config["policies_dir"] = str(FIXTURES.parent.parent / "policies")
    config["auth"]["issuers"][0]["jwks_file"] = str(FIXTURES.parent / "keys" / "jwks.json")
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    assert main(["launch-plan", "--config", str(tmp_path / "gateway.yaml")]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["argv"][:2] == ["mistralrs", "serve"]
    assert "--no-ui" in plan["argv"] and "127.0.0.1" in plan["argv"]
    assert len(plan["serve_identity"]) == 64


def test_token_refuses_a_tenant_without_a_policy(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(FIXTURES / "gateway.yaml")
    assert main(["token", "--config", config, "--tenant", "nobody"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: tenant_not_configured: no policy for tenant 'nobody'")


def test_token_chooses_the_issuer(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(FIXTURES / "gateway.yaml")
    argv = ["token", "--config", config, "--tenant", "globex"]
    assert main([*argv, "--issuer", "https://dev.gateway.local", "--scope", "evidence"]) == 0
    claims = jwt.decode(capsys.readouterr().out.strip(), options={"verify_signature": False})
    assert (claims["tenant"], claims["scope"]) == ("globex", "evidence")
    assert main([*argv, "--issuer", "https://idp.test"]) == 1  # an RS256 issuer cannot mint
    assert "no HS256" in capsys.readouterr().err


def test_check_writes_list_positions_as_its_file_findings_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = (FIXTURES / "gateway.yaml").read_text()
    (tmp_path / "gateway.yaml").write_text(config.replace("algorithms:", "algoritms:", 1))
    assert main(["check", "--config", str(tmp_path / "gateway.yaml")]) == 1
    err = capsys.readouterr().err
    assert "auth.issuers[0].algoritms" in err and "issuers.0" not in err
