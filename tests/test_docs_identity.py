"""docs/identity.md runs as written and says what the code does.

Every ``sh`` block runs from the repository root with the project's commands
on ``PATH`` (``tests/support/docblocks.py``): keys, certificates and configs
are made in a temporary directory, servers listen on 127.0.0.1 port 0 and are
ended by the block itself (or with its session when the time is up). The
numbers and names the page states are checked against the code, so the page
fails the build when the code moves away from it.
"""

from __future__ import annotations

import functools
import inspect
import re
import subprocess

import pytest

from gateway.auth.authenticator import MAX_BEARER_CHARS, Authenticator
from gateway.auth.failures import REASONS
from gateway.auth.keys import JWKS_FETCH_TIMEOUT_S, MIN_HS256_SECRET_BYTES
from gateway.config import IssuerConfig, TLSConfig
from gateway.tools.preflight import MAX_PEM_BYTES
from tests.support.docblocks import REPO, Block, blocks, run, shell_blocks

PAGE = REPO / "docs" / "identity.md"
TEXT = PAGE.read_text(encoding="utf-8")
SHELL = shell_blocks(PAGE)


@functools.cache
def ran(block: Block) -> subprocess.CompletedProcess[str]:
    """Each block once per session: the checks below read the same run."""
    return run(block)


def _block(section: str, containing: str = "") -> Block:
    (found,) = [b for b in SHELL if b.section.startswith(section) and containing in b.code]
    return found


@pytest.mark.parametrize("block", SHELL, ids=[b.name for b in SHELL])
def test_every_shell_block_runs_as_written(block: Block) -> None:
    done = ran(block)
    assert done.returncode == 0, f"{block.page}:{block.line}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), "every command shows its result"


def test_the_worked_example_shows_each_refusal_and_its_reason() -> None:
    done = ran(_block("Worked example"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "good: HTTP 200 ['chat']" in out
    for kind in ("wrong-audience", "expired", "too-long", "no-tenant", "unknown-kid", "other-key"):
        assert f"{kind}: HTTP 401 invalid_token" in out, kind
    assert "unknown-tenant: HTTP 403 tenant_not_configured" in out
    assert "no-inference-scope: HTTP 403 insufficient_scope" in out
    for reason in ("audience", "expired", "lifetime", "missing_claim", "unknown_kid", "signature"):
        assert f'gateway_auth_failures_total{{reason="{reason}"}} 1.0' in out, reason
        assert f"authentication failed: {reason} | request_id req_" in out, reason
    # The caller's answer never carries the reason.
    assert "caller got invalid_token" in out


def test_mtls_refuses_a_client_without_a_certificate() -> None:
    done = ran(_block("Client certificates"))
    assert done.returncode == 0, done.stderr
    assert '{"status":"ok"}' in done.stdout
    assert "no client certificate: refused in the handshake" in done.stdout


def test_check_names_the_key_that_does_not_match() -> None:
    done = ran(_block("TLS on the callers' listener", "mistralrs-gateway check"))
    assert done.returncode == 0, done.stderr
    assert ": ok" in done.stdout
    assert re.search(
        r"listen\.tls\.keyfile: \S+tls\.key: does not match the certificate", done.stdout
    )


def test_api_keys_and_dev_tokens_work_as_shown() -> None:
    keys = ran(_block("Static API keys"))
    assert keys.returncode == 0, keys.stderr
    assert re.search(r'"data":\[\{"id":"chat".*HTTP 200', keys.stdout)
    assert '"code":"invalid_token"' in keys.stdout
    assert 'gateway_auth_failures_total{reason="unknown_api_key"} 1.0' in keys.stdout
    # The caller's key may not scrape; the scraper's key may (spec §24).
    assert '"code":"insufficient_scope"' in keys.stdout and " HTTP 403" in keys.stdout
    tokens = ran(_block("Development tokens"))
    assert tokens.returncode == 0, tokens.stderr
    assert '"scope": "inference"' in tokens.stdout and '"sub": "dev"' in tokens.stdout
    assert "tenant_not_configured" in tokens.stderr


def test_every_failure_reason_has_a_row() -> None:
    rows = set(re.findall(r"^\| `([a-z_]+)` \| ", TEXT, re.M))
    assert set(REASONS) <= rows


def test_the_issuer_excerpt_names_every_key_with_its_default() -> None:
    (excerpt,) = [b.code for b in _yaml_blocks() if "auth:\n  issuers:" in b.code]
    for name, field in IssuerConfig.model_fields.items():
        if name in ("jwks_url", "hs256_secret_env"):
            assert name in TEXT, name  # the alternatives of jwks_file, in the table
            continue
        assert re.search(rf"^\s+-? ?{name}: ", excerpt, re.M), name
        if field.default is not None and not field.is_required():
            default = field.default
            shown = re.search(rf"^\s+{name}: (\S+)\s+# default", excerpt, re.M)
            assert shown and shown.group(1) == str(default), name
    for name in TLSConfig.model_fields:
        assert f"{name}:" in TEXT, name


def _yaml_blocks() -> list[Block]:
    return [b for b in blocks(PAGE) if b.lang == "yaml"]


def test_the_numbers_the_page_states_are_the_codes() -> None:
    assert f"{MAX_BEARER_CHARS:,}".replace(",", " ") in TEXT  # 16 384 characters
    assert f"{JWKS_FETCH_TIMEOUT_S:g} s for the" in TEXT
    assert f"≥ {MIN_HS256_SECRET_BYTES} bytes" in TEXT
    assert f"≤ {MAX_PEM_BYTES // (1024 * 1024)} MiB" in TEXT
    cache = inspect.signature(Authenticator).parameters["cache_size"].default
    assert f"up to {cache:,}".replace(",", " ") in TEXT
    for name, value in (
        ("leeway_s", 30),
        ("max_lifetime_s", 3600),
        ("jwks_refresh_min_s", 2),
    ):
        assert IssuerConfig.model_fields[name].default == value, name
    assert "default **30** s" in TEXT


def test_the_readme_and_deploy_guide_link_it() -> None:
    assert "docs/identity.md" in (REPO / "README.md").read_text(encoding="utf-8")
    assert "identity.md" in (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
