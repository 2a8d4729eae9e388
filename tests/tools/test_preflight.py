"""Preflight: every file the config names is opened and parsed (check, serve).

Real files: certificates from trustme, the fixture JWKS, directories under
tmp_path. Each problem must name its config key and its file, and never a
secret or a file's contents.
"""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from cryptography.hazmat.primitives import serialization

from gateway.books.audit_file import lock as audit_lock
from gateway.books.audit_file import lock_path
from gateway.books.audit_file import unlock as audit_unlock
from gateway.config.loader import load_config
from gateway.core.digests import EMPTY_SHA256, placeholder_reason
from gateway.testing.harness import DEMO_SECRET_ENV, SIM_ROUTE, default_policy, write_config
from gateway.tools.cli import main
from gateway.tools.preflight import MAX_PEM_BYTES, Finding, preflight
from tests.support.jwt import HS_SECRET, JWKS_PATH, private_pem
from tests.support.process import REPO
from tests.support.stack import issuers

ENV = {DEMO_SECRET_ENV: HS_SECRET}


class Pki:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.ca = trustme.CA()
        leaf = self.ca.issue_cert("127.0.0.1")
        self.cert = self._write("tls.crt", b"".join(b.bytes() for b in leaf.cert_chain_pems))
        self.key = self._write("tls.key", leaf.private_key_pem.bytes())
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.leaf = leaf

    def _write(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        path.write_bytes(data)
        return path


def _config(tmp: Path, **sections: Any) -> Path:
    return write_config(
        tmp,
        upstream_port=1234,
        policies={"acme": default_policy("acme")},
        issuers=issuers(),
        **sections,
    )


def _findings(config: Path, env: dict[str, str] | None = None) -> list[Finding]:
    return preflight(load_config(config), ENV if env is None else env)


def _tls(pki: Pki, **extra: Any) -> dict[str, Any]:
    tls = {"certfile": str(pki.cert), "keyfile": str(pki.key), **extra}
    return {"host": "127.0.0.1", "port": 0, "tls": tls}


def test_a_good_config_has_no_findings(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "tls")
    config = _config(tmp_path, listen=_tls(pki, client_ca=str(pki.ca_file)))
    assert _findings(config) == []


@pytest.mark.parametrize(
    ("breakage", "key", "problem"),
    [
        ("missing_cert", "listen.tls.certfile", "cannot read (FileNotFoundError)"),
        ("missing_key", "listen.tls.keyfile", "cannot read (FileNotFoundError)"),
        ("junk_cert", "listen.tls.certfile", "holds no PEM certificate"),
        ("junk_key", "listen.tls.keyfile", "is not a PEM private key usable with"),
        ("other_key", "listen.tls.keyfile", "does not match the certificate"),
        ("encrypted_key", "listen.tls.keyfile", "is encrypted"),
        ("cert_is_dir", "listen.tls.certfile", "cannot read (IsADirectoryError)"),
    ],
)
def test_tls_files_load_together(tmp_path: Path, breakage: str, key: str, problem: str) -> None:
    pki = Pki(tmp_path / "tls")
    if breakage == "missing_cert":
        pki.cert.unlink()
    elif breakage == "missing_key":
        pki.key.unlink()
    elif breakage == "junk_cert":
        pki.cert.write_text("not a certificate\n")
    elif breakage == "junk_key":
        pki.key.write_text("not a key\n")
    elif breakage == "other_key":
        pki.key.write_bytes(pki.ca.issue_cert("other.test").private_key_pem.bytes())
    elif breakage == "encrypted_key":
        key_obj = serialization.load_pem_private_key(pki.key.read_bytes(), None)
        encrypted = key_obj.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"a-passphrase"),
        )
        pki.key.write_bytes(encrypted)
    elif breakage == "cert_is_dir":
        pki.cert.unlink()
        pki.cert.mkdir()
    findings = _findings(_config(tmp_path, listen=_tls(pki)))
    assert [(f.level, f.key) for f in findings] == [("error", key)]
    assert problem in findings[0].problem
    path = pki.cert if key.endswith("certfile") else pki.key
    assert findings[0].path == path
    assert str(findings[0]).startswith(f"{key}: {path}: ")


def test_client_ca_must_be_a_ca_bundle(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "tls")
    junk = pki.dir / "junk.pem"
    junk.write_text("hello\n")
    for ca, problem in (
        (junk, "holds no PEM certificate"),
        (pki.cert, "holds no CA certificate"),  # a leaf is not a CA
        (pki.dir / "absent.pem", "cannot read (FileNotFoundError)"),
    ):
        findings = _findings(_config(tmp_path, listen=_tls(pki, client_ca=str(ca))))
        assert [(f.key, f.path) for f in findings] == [("listen.tls.client_ca", ca)], ca
        assert problem in findings[0].problem


def test_an_expired_certificate_is_a_warning(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "tls")
    past = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    leaf = pki.ca.issue_cert("127.0.0.1", not_before=past, not_after=past.replace(month=6))
    pki.cert.write_bytes(b"".join(b.bytes() for b in leaf.cert_chain_pems))
    pki.key.write_bytes(leaf.private_key_pem.bytes())
    findings = _findings(_config(tmp_path, listen=_tls(pki)))
    assert [(f.level, f.key) for f in findings] == [("warning", "listen.tls.certfile")]
    assert "expired on 2020-06-01" in findings[0].problem


def _with_jwks(tmp: Path, document: str | bytes) -> Path:
    jwks = tmp / "jwks.json"
    jwks.write_bytes(document.encode() if isinstance(document, str) else document)
    configured = issuers()
    configured[0]["jwks_file"] = str(jwks)
    return write_config(
        tmp, upstream_port=1234, policies={"acme": default_policy("acme")}, issuers=configured
    )


def test_jwks_files_are_parsed_and_their_keys_usable(tmp_path: Path) -> None:
    private_jwk = json.loads(JWKS_PATH.read_text())["keys"][0]
    private_jwk["d"] = "c2VjcmV0LXByaXZhdGUtZXhwb25lbnQ"
    cases = [
        ("{not json", "not valid JSON"),
        ('{"keys": "nope"}', "not a JWK Set"),
        ('{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA"}]}', "no key usable"),
        (json.dumps({"keys": [private_jwk]}), "private or symmetric key material"),
    ]
    for document, problem in cases:
        findings = _findings(_with_jwks(tmp_path, document))
        assert [(f.key, f.path) for f in findings] == [
            ("auth.issuers[0].jwks_file", tmp_path / "jwks.json")
        ], document
        assert problem in findings[0].problem
        # The file's contents never appear, private members least of all.
        assert "c2VjcmV0" not in str(findings[0]) and private_jwk["n"][:16] not in str(findings[0])
    (tmp_path / "jwks.json").unlink()
    findings = _findings(tmp_path / "gateway.yaml")
    assert [str(f) for f in findings] == [
        f"auth.issuers[0].jwks_file: {tmp_path / 'jwks.json'}: cannot read (FileNotFoundError)"
    ]


def test_files_over_their_bound_name_the_bound(tmp_path: Path) -> None:
    config = _with_jwks(tmp_path, b" " * (1_048_576 + 1))  # jwks_max_bytes, by default
    assert [str(f) for f in _findings(config)] == [
        f"auth.issuers[0].jwks_file: {tmp_path / 'jwks.json'}: larger than jwks_max_bytes"
    ]
    pki = Pki(tmp_path / "tls")
    pki.cert.write_bytes(b" " * (MAX_PEM_BYTES + 1))
    assert [str(f) for f in _findings(_config(tmp_path, listen=_tls(pki)))] == [
        f"listen.tls.certfile: {pki.cert}: larger than {MAX_PEM_BYTES} bytes"
    ]


def test_hs256_secret_must_be_set_and_is_never_shown(tmp_path: Path) -> None:
    config = _config(tmp_path)
    findings = _findings(config, env={})
    assert [(f.key, f.path) for f in findings] == [("auth.issuers[1].hs256_secret_env", None)]
    assert DEMO_SECRET_ENV in findings[0].problem and "not set" in findings[0].problem
    short = "short-secret-value"
    findings = _findings(config, env={DEMO_SECRET_ENV: short})
    assert "shorter than 32 bytes" in findings[0].problem
    assert short not in str(findings[0])


def test_the_image_link_key_must_be_set_long_and_is_never_shown(tmp_path: Path) -> None:
    config = _config(tmp_path, images={"url_key_env": "LINK_KEY"})
    short = "k" * 31
    for env in ({}, {"LINK_KEY": short}):
        findings = _findings(config, env={**ENV, **env})
        assert [(f.key, f.level) for f in findings] == [("images.url_key_env", "error")]
        assert "32 bytes" in findings[0].problem and short not in str(findings[0])
    assert _findings(config, env={**ENV, "LINK_KEY": "k" * 32}) == []


def test_directories_must_be_usable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    config = _config(
        tmp_path,
        policies_dir=str(tmp_path / "no-such-policies"),
        staging={"dir": str(blocker / "evidence"), "catalog": str(tmp_path / "var")},
        audit={"path": str(blocker / "deep" / "receipts.jsonl")},
    )
    (tmp_path / "var").mkdir(exist_ok=True)
    found = {f.key: f for f in _findings(config)}
    assert set(found) == {"policies_dir", "staging.dir", "staging.catalog", "audit.path"}
    assert found["policies_dir"].problem == "does not exist"
    assert found["staging.dir"].problem == f"cannot be created ({blocker} is not a directory)"
    assert found["staging.catalog"].problem == "is a directory"
    assert found["audit.path"].problem.startswith("its folder cannot be created")
    assert all(f.level == "error" for f in found.values())


def test_directories_that_do_not_exist_yet_pass_and_are_not_created(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        staging={"dir": "state/evidence", "catalog": "state/db/catalog.sqlite3"},
        audit={"path": "state/audit/receipts.jsonl"},
    )
    assert _findings(config) == []
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("digest", "placeholder"),
    [
        ("0" * 64, True),
        ("f" * 64, True),
        ("deadbeef" * 8, True),
        ("0123456789abcdef" * 4, True),
        ("ab" * 32, True),
        ("deadbeef" + "0" * 56, True),
        ("1212" * 15 + "3434", True),  # four distinct digits
        ("deadbeef" + "9c4f1e27b3a8d06c5e2f7a1b9d3c8e04" + "6b2a7f1c3e9d5a08", True),
        (EMPTY_SHA256, True),
        ("b30e5a82b8aa61ebb10bf9e1f432983776af141dcabe19cb431a6e8572e1a139", False),
        (SIM_ROUTE.rsplit("/", 1)[1], False),
    ],
)
def test_placeholder_rule(digest: str, placeholder: bool) -> None:
    assert (placeholder_reason(digest) is not None) == placeholder


def test_check_warns_on_placeholder_digests_without_failing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = "0" * 64
    launch = {
        "version": "0.9.2",
        "binary_sha256": "deadbeef" * 8,
        "model_public_id": "org/model",
        "model_revision": "b" * 40,
        "model_bundle_sha256": bundle,
        "model_dir": f"/srv/mosaic-models/{bundle}",
        "port": 1234,
    }
    policy = default_policy("acme", api_keys=[{"name": "batch", "sha256": "a" * 64}])
    policy["models"] = {"gemma-4-mm": f"/srv/mosaic-models/{bundle}"}
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={"acme": policy},
        issuers=issuers(),
        upstream={"route": f"/srv/mosaic-models/{bundle}", "launch": launch},
    )
    assert main(["check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert any("upstream.launch.binary_sha256: looks like a placeholder" in w for w in warnings)
    assert any(
        "upstream.launch.model_bundle_sha256: looks like a placeholder" in w for w in warnings
    )
    policy_file = tmp_path / "policies" / "acme.yaml"
    assert f"warning: api_keys[0].sha256: {policy_file}: looks like a placeholder" in out


def test_a_placeholder_in_a_yml_policy_names_that_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = default_policy("acme", api_keys=[{"name": "batch", "sha256": "a" * 64}])
    config = write_config(
        tmp_path, upstream_port=1234, policies={"acme": policy}, issuers=issuers()
    )
    policies = tmp_path / "policies"
    (policies / "acme.yaml").rename(policies / "acme.yml")
    assert main(["check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"warning: api_keys[0].sha256: {policies / 'acme.yml'}: looks like a placeholder" in out


def test_check_lists_every_file_problem_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEMO_SECRET_ENV)
    pki = Pki(tmp_path / "tls")
    pki.key.write_bytes(pki.ca.issue_cert("other.test").private_key_pem.bytes())
    configured = issuers()
    configured[0]["jwks_file"] = str(tmp_path / "missing-jwks.json")
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={"acme": default_policy("acme")},
        issuers=configured,
        listen=_tls(pki, client_ca=str(tmp_path / "missing-ca.pem")),
    )
    (tmp_path / "policies" / "globex.yaml").write_text("tenant: globex\nmodles: {}\n")
    assert main(["check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: configuration is invalid:\n")
    for fragment in (
        f"listen.tls.keyfile: {pki.key}: does not match",
        f"listen.tls.client_ca: {tmp_path / 'missing-ca.pem'}: cannot read",
        "auth.issuers[0].jwks_file:",
        f"auth.issuers[1].hs256_secret_env: hs256_secret_env {DEMO_SECRET_ENV} is not set",
        "globex.yaml: modles",
    ):
        assert fragment in err, fragment
    assert "BEGIN" not in err  # no PEM text


# ----------------------------------------------------------- serve, for real


def _serve_once(config: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "gateway.tools.cli",
        "serve",
        "--config",
        str(config),
        "--port",
        "0",
    ]
    return subprocess.run(
        argv,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", DEMO_SECRET_ENV: HS_SECRET},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("missing", ["certfile", "jwks_file", "policies_dir", "client_ca"])
def test_serve_reports_a_missing_file_as_one_line(tmp_path: Path, missing: str) -> None:
    pki = Pki(tmp_path / "tls")
    configured = issuers()
    jwks = tmp_path / "jwks.json"
    shutil.copyfile(JWKS_PATH, jwks)
    configured[0]["jwks_file"] = str(jwks)
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={"acme": default_policy("acme")},
        issuers=configured,
        listen=_tls(pki, client_ca=str(pki.ca_file)),
    )
    expected = {
        "certfile": ("listen.tls.certfile", pki.cert, "cannot read (FileNotFoundError)"),
        "client_ca": ("listen.tls.client_ca", pki.ca_file, "cannot read (FileNotFoundError)"),
        "jwks_file": ("auth.issuers[0].jwks_file", jwks, "cannot read (FileNotFoundError)"),
        "policies_dir": ("policies_dir", tmp_path / "policies", "does not exist"),
    }
    key, path, problem = expected[missing]
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    result = _serve_once(config)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [f"error: {key}: {path}: {problem}"]


def test_serve_refuses_an_unreadable_key_without_printing_it(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "tls")
    pki.key.write_bytes(private_pem("rsa1"))  # a real key, of another certificate
    result = _serve_once(_config(tmp_path, listen=_tls(pki)))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"error: listen.tls.keyfile: {pki.key}: does not match the certificate in "
        "listen.tls.certfile"
    ]
    assert "BEGIN" not in result.stderr and "Traceback" not in result.stderr


def test_config_fixture_still_checks(tmp_path: Path) -> None:
    # The example config keeps passing the new checks (it names repo files).
    config = yaml.safe_load((REPO / "fixtures" / "config" / "gateway.yaml").read_text())
    assert config["auth"]["issuers"][0]["jwks_file"] == "../keys/jwks.json"
    assert main(["check", "--config", str(REPO / "fixtures" / "config" / "gateway.yaml")]) == 0


# ------------------------------------------------ a prefix cache shared (spec §21)

_CHAT = "9f2b6c1d4e8a7035b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4"
_EMBED = "4c7e1a9b2d5f8036e9a1b4c7d0e3f6a9b2c5d8e1f4a7b0c3d6e9f2a5b8c1d4e7"


def _launch(bundle: str, port: int, prefix_cache_n: int) -> dict[str, Any]:
    return {
        "version": "0.9.2",
        "binary_sha256": "b30e5a82b8aa61ebb10bf9e1f432983776af141dcabe19cb431a6e8572e1a139",
        "model_public_id": "org/model",
        "model_revision": "1f0e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c",
        "model_bundle_sha256": bundle,
        "model_dir": f"/srv/mosaic-models/{bundle}",
        "port": port,
        "prefix_cache_n": prefix_cache_n,
    }


def _shared_workers(
    tmp_path: Path, chat_cache: int, embed_cache: int, *, globex_chats: bool
) -> Path:
    chat, embed = f"/srv/mosaic-models/{_CHAT}", f"/srv/mosaic-models/{_EMBED}"
    globex_models = {"chat": chat, "embed": embed} if globex_chats else {"embed": embed}
    return write_config(
        tmp_path,
        upstream_port=1234,
        policies={
            "acme": default_policy("acme", models={"chat": chat, "embed": embed}),
            "globex": default_policy("globex", models=globex_models),
            "initech": default_policy("initech", models={"chat-too": chat}),
        },
        issuers=issuers(),
        upstreams=[
            {
                "name": "chat",
                "base_url": "http://127.0.0.1:1234",
                "routes": [chat],
                "launch": _launch(_CHAT, 1234, chat_cache),
            },
            {
                "name": "embed",
                "base_url": "http://127.0.0.1:1235",
                "routes": [embed],
                "launch": _launch(_EMBED, 1235, embed_cache),
            },
        ],
    )


def _prefix_warnings(config: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["check", "--config", str(config)]) == 0  # a warning, never fatal
    out = capsys.readouterr().out
    return [line for line in out.splitlines() if "prefix_cache_n" in line]


def test_check_warns_when_tenants_share_a_prefix_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _shared_workers(tmp_path, 16, 0, globex_chats=False)
    # acme and initech name the chat route (under their own aliases); globex
    # shares only the embedding worker, which keeps no prefix cache.
    assert _prefix_warnings(config, capsys) == [
        f"warning: upstreams[0].launch.prefix_cache_n: is 16 and route /srv/mosaic-models/{_CHAT}"
        " is in the policies of tenants acme, initech: a prefix one of them sent shortens the"
        " others' time to first token (set 0, or give each tenant its own worker)"
    ]


def test_check_names_every_shared_cache_and_only_those(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    warned = _prefix_warnings(_shared_workers(tmp_path, 4, 2, globex_chats=True), capsys)
    assert len(warned) == 2
    assert "upstreams[0].launch.prefix_cache_n: is 4 " in warned[0]
    assert "tenants acme, globex, initech:" in warned[0]
    assert "upstreams[1].launch.prefix_cache_n: is 2 " in warned[1]
    assert "tenants acme, globex:" in warned[1]
    # No prefix cache, no warning, however many tenants share the worker.
    assert (
        _prefix_warnings(_shared_workers(tmp_path / "off", 0, 0, globex_chats=True), capsys) == []
    )


def test_one_tenant_per_cached_route_is_not_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    route = f"/srv/mosaic-models/{_CHAT}"
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={
            "acme": default_policy("acme", models={"chat": route}),
            "globex": default_policy("globex", models={}),
        },
        issuers=issuers(),
        upstream={"route": route, "launch": _launch(_CHAT, 1234, 16)},
    )
    assert _prefix_warnings(config, capsys) == []
    # The one-worker form is named as such when it is shared.
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={
            "acme": default_policy("acme", models={"chat": route}),
            "globex": default_policy("globex", models={"mine": route}),
        },
        issuers=issuers(),
        upstream={"route": route, "launch": _launch(_CHAT, 1234, 16)},
    )
    (warning,) = _prefix_warnings(config, capsys)
    assert warning.startswith("warning: upstream.launch.prefix_cache_n: is 16 and route ")


def test_a_postgres_state_needs_its_dsn_env_and_never_shows_it(tmp_path: Path) -> None:
    config = _config(tmp_path, state={"backend": "postgres", "dsn_env": "STATE_DSN"})
    missing = _findings(config)
    assert [(f.key, f.level) for f in missing] == [("state.dsn_env", "error")]
    assert "STATE_DSN" in missing[0].problem
    secret = "postgresql://gateway:hunter2-secret@db.internal:5432/gateway"
    assert _findings(config, {**ENV, "STATE_DSN": secret}) == []
    wrong = "mysql://gateway:hunter2-secret@db.internal/gateway"
    (finding,) = _findings(config, {**ENV, "STATE_DSN": wrong})
    assert "hunter2" not in str(finding) and "db.internal" not in str(finding)


# ------------------------------------------------ releases (spec §18)


def test_check_names_a_policy_alias_of_an_unknown_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stable, canary = f"/srv/mosaic-models/{_CHAT}", f"/srv/mosaic-models/{_EMBED}"
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={
            "acme": default_policy("acme", models={"chat": "release:chat"}),
            "globex": default_policy("globex", models={"chat": "release:chta"}),
        },
        issuers=issuers(),
        upstreams=[
            {"name": "old", "base_url": "http://127.0.0.1:1234", "routes": [stable]},
            {"name": "new", "base_url": "http://127.0.0.1:1235", "routes": [canary]},
        ],
        releases=[{"name": "chat", "stable": stable, "canary": canary, "canary_percent": 5}],
    )
    assert main(["check", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert (
        f"{tmp_path / 'policies' / 'globex.yaml'}: models.chat: must name a configured release"
        in err
    )
    assert "acme.yaml" not in err, "the configured release is no problem"
    (tmp_path / "policies" / "globex.yaml").unlink()
    assert main(["check", "--config", str(config)]) == 0


def test_a_release_alias_shares_both_of_its_routes_caches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chat, embed = f"/srv/mosaic-models/{_CHAT}", f"/srv/mosaic-models/{_EMBED}"
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={
            "acme": default_policy("acme", models={"chat": "release:chat"}),
            "globex": default_policy("globex", models={"other": embed}),
        },
        issuers=issuers(),
        upstreams=[
            {
                "name": "old",
                "base_url": "http://127.0.0.1:1234",
                "routes": [chat],
                "launch": _launch(_CHAT, 1234, 8),
            },
            {
                "name": "new",
                "base_url": "http://127.0.0.1:1235",
                "routes": [embed],
                "launch": _launch(_EMBED, 1235, 8),
            },
        ],
        releases=[{"name": "chat", "stable": chat, "canary": embed, "canary_percent": 5}],
    )
    # globex names the canary's route directly; acme reaches it through the release.
    warned = _prefix_warnings(config, capsys)
    assert len(warned) == 1 and "upstreams[1]" in warned[0] and "tenants acme, globex:" in warned[0]


# ------------------------------------------------ the fleet (spec §24)


def test_a_second_writer_on_an_audit_path_is_refused_naming_audit_path(tmp_path: Path) -> None:
    """``serve`` would be a second writer: an error naming ``audit.path`` (not a
    start-up failure deep in the lifespan); ``check``, run beside the running
    gateway, warns instead. Nothing is created when nobody holds the path."""
    audit = tmp_path / "audit" / "receipts.jsonl"
    config = load_config(_config(tmp_path, audit={"path": str(audit)}))
    assert preflight(config, ENV, serving=True) == []
    assert not lock_path(audit).exists(), "the lock is only tried, never created"
    audit.parent.mkdir()
    held = audit_lock(audit)  # a running gateway's
    try:
        (error,) = preflight(config, ENV, serving=True)
        assert (error.level, error.key, error.path) == ("error", "audit.path", None)
        assert str(error).startswith("audit.path: held by another gateway process")
        (warning,) = preflight(config, ENV)
        assert (warning.level, warning.key) == ("warning", "audit.path")
    finally:
        audit_unlock(held)
    assert preflight(config, ENV, serving=True) == []  # the holder is gone


def test_check_prints_the_state_backend_replica_limits_store_and_every_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stable, canary = f"/srv/mosaic-models/{_CHAT}", f"/srv/mosaic-models/{_EMBED}"
    secret = "postgresql://gateway:hunter2-secret@db.internal:5432/gateway"
    config = write_config(
        tmp_path,
        upstream_port=1234,
        policies={"acme": default_policy("acme", models={"chat": "release:chat"})},
        issuers=issuers(),
        upstreams=[
            {"name": "old", "base_url": "http://127.0.0.1:1234", "routes": [stable]},
            {"name": "new", "base_url": "http://127.0.0.1:1235", "routes": [canary]},
        ],
        releases=[
            {"name": "chat", "stable": stable, "canary": canary, "canary_percent": 5},
            {
                "name": "next",
                "stable": stable,
                "canary": canary,
                "cohort": "tenant",
                "gate": {"min_requests": 7},
            },
        ],
        state={"backend": "postgres", "dsn_env": "STATE_DSN", "replica_id": "gw-0"},
        limits_store={
            "backend": "redis",
            "url": "rediss://redis.internal:6380/2",
            "password_env": "REDIS_PW",
        },
    )
    env = {DEMO_SECRET_ENV: HS_SECRET, "STATE_DSN": secret, "REDIS_PW": "hunter3-secret"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert main(["check", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert lines["state"] == (
        "state: postgres (DSN from $STATE_DSN, shared by every replica) timeout_ms=1000 "
        "replica_id=gw-0"
    )
    assert lines["limits_store"].startswith(
        "limits_store: redis rediss://redis.internal:6380/2 key_prefix=mrgw: timeout_ms=250 "
        "on_error=closed unready_after_s=5"
    )
    assert lines["release chat"] == (
        f"release chat: stable {stable} canary {canary} canary_percent=5 cohort=subject "
        "fallback=on gate off (manual rollback only)"
    )
    assert "cohort=tenant" in lines["release next"] and "min_requests=7" in lines["release next"]
    assert lines["audit"].startswith("audit: ")
    assert "hunter" not in out and "db.internal" not in out


# -- exposure (spec §24) -------------------------------------------------------------


def _check_lines(config: Path, capsys: pytest.CaptureFixture[str], key: str) -> list[str]:
    assert main(["check", "--config", str(config)]) == 0  # warnings, never fatal
    return [line for line in capsys.readouterr().out.splitlines() if f"warning: {key}:" in line]


def test_check_warns_that_metrics_share_the_callers_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    [line] = _check_lines(_config(tmp_path / "shared"), capsys, "metrics.listen")
    assert "callers' port" in line and "scope metrics" in line
    apart = {"path": "/metrics", "listen": {"host": "127.0.0.1", "port": 9464}}
    assert _check_lines(_config(tmp_path / "apart", metrics=apart), capsys, "metrics.listen") == []


def test_check_warns_when_evidence_quotas_exceed_the_staging_volume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def config(name: str, quota: int) -> Path:
        policy = default_policy("acme", evidence={"max_bytes": quota})
        return write_config(
            tmp_path / name,
            upstream_port=1234,
            policies={
                "acme": policy,
                "globex": default_policy("globex", evidence=policy["evidence"]),
            },
            issuers=issuers(),
        )

    # No volume holds two exbibytes; every volume holds two bytes.
    [line] = _check_lines(config("over", 1 << 60), capsys, "staging.dir")
    assert f"sum to {2 << 60} bytes" in line and "fill it for every tenant" in line
    assert _check_lines(config("under", 1), capsys, "staging.dir") == []
