"""Fuzz config and policy loading: generated YAML text and mutated documents.

Property (spec §2 ``check``/``serve``, §3): whatever the operator's files
hold, loading ends in a parsed model or a :class:`ConfigError` listing the
problems, never another exception (a traceback instead of "file: key:
problem" would also risk printing a secret value).
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import GatewayConfig
from gateway.config.loader import (
    ConfigError,
    load_policies,
    parse_config,
    parse_yaml,
    validate_model,
)
from gateway.config.policy import TenantPolicy, build_policy_set, check_policy
from tests.fuzz.budget import budget
from tests.fuzz.shapes import json_paths

pytestmark = pytest.mark.fuzz

BUNDLE = "b3" * 32
ROUTE = f"/srv/mosaic-models/{BUNDLE}"
BASE = Path("/nonexistent/gateway-fuzz")

CONFIG: dict[str, Any] = {
    "listen": {"host": "127.0.0.1", "port": 8443, "shutdown_grace_s": 30},
    "upstream": {
        "base_url": "http://127.0.0.1:1234",
        "route": ROUTE,
        "connect_timeout_s": 2,
        "idle_timeout_s": 30,
        "max_line_bytes": 1_048_576,
        "launch": {
            "version": "0.8.2",
            "binary_sha256": "a1" * 32,
            "model_public_id": "google/gemma",
            "model_revision": "abc123",
            "model_bundle_sha256": BUNDLE,
            "model_dir": ROUTE,
            "port": 1234,
            "device": "cpu",
        },
    },
    "auth": {
        "issuers": [
            {
                "issuer": "https://idp.test",
                "audience": "mistralrs-gateway",
                "algorithms": ["RS256"],
                "jwks_file": "keys/jwks.json",
            },
            {
                "issuer": "https://dev.test",
                "audience": "mistralrs-gateway",
                "algorithms": ["HS256"],
                "hs256_secret_env": "DEV_SECRET",
            },
        ]
    },
    "policies_dir": "policies",
    "staging": {"dir": "var/evidence", "catalog": "var/c.sqlite3", "worker_media": "data_url"},
    "admission": {"capacity": 8, "max_queue": 64},
    "limits": {"max_body_bytes": 1_048_576, "max_media_bytes": 36_700_160},
    "cors": {"allow_origins": ["https://app.example.com"], "max_age_s": 600},
    "audit": {"path": "receipts.jsonl"},
    "metrics": {"path": "/metrics"},
}
POLICY: dict[str, Any] = {
    "tenant": "acme",
    "models": {"gemma-4-mm": ROUTE},
    "endpoints": ["chat.completions", "completions", "models", "evidence"],
    "modalities": ["text", "image", "audio", "video"],
    "api_keys": [{"name": "nightly", "sha256": "9f" * 32}],
    "limits": {"max_body_bytes": 262_144, "max_output_tokens": 512, "requests_per_minute": 600},
    "admission": {"share": 1, "max_permits": 4, "queue_timeout_s": 5},
    "cost": {"base": 1, "image": 1, "audio": 1, "video": 2},
    "media": {"caller_urls": "reject", "inline_data": "reject"},
}

# ------------------------------------------------------------------ strategies

odd_text = st.one_of(
    st.text(max_size=16),
    st.sampled_from(
        [
            "",
            "none",
            "latest",
            "0.0.0.0",
            "http://10.0.0.1:1234",
            "http://[::1",
            "http://127.0.0.1:99999",
            "http://127.0.0.1:1234/path",
            "file:///etc/passwd",
            "*",
            "HS256",
            "none",
            "../../etc",
            "default",
            "\x00",
            "🙂",
            "1e999",
            "-1",
        ]
    ),
)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), odd_text, st.integers(2**63, 2**80)
)
values = st.recursive(
    scalars,
    lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.one_of(odd_text, st.integers()), c, max_size=3)
    ),
    max_leaves=8,
)


def _container(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        doc = doc[key]
    return doc


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> Any:
    """``base`` with 1-4 edits: delete, retype, misspell or add a key; nothing is shared."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 4))):
        paths = json_paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "delete", "rename", "add"]))
        if not path:
            doc = draw(values) if action == "replace" else doc
            continue
        parent = _container(doc, path)
        key = path[-1]
        if action == "replace":
            parent[key] = draw(values)
        elif action == "delete":
            del parent[key]
        elif isinstance(parent, dict) and action == "rename":
            parent[f"{key}{draw(st.sampled_from(['_', 's', ' ', 'X']))}"] = parent.pop(key)
        elif isinstance(parent, dict):
            parent[draw(odd_text)] = draw(values)
        else:
            parent.append(draw(values))
    return doc


FRAGMENTS = [
    "a: 1\n",
    "upstream:\n",
    "  route: /x\n",
    "- ",
    ": ",
    "? [1]\n: 2\n",
    "? {a: 1}\n: 2\n",
    "{",
    "}",
    "[",
    "]",
    "&a ",
    "*a",
    "<<: *a\n",
    "<<: 5\n",
    "!!python/object/apply:os.system ['true']\n",
    "!!binary 'not base64!'\n",
    "!!timestamp 2001-13-45\n",
    "d: 2001-13-45\n",
    "d: 2001-02-29 25:61:61\n",
    "!!int 0x\n",
    "!!float nope\n",
    "!!set {a, b}\n",
    "!!omap [a: 1]\n",
    "%YAML 1.1\n---\n",
    "---\n",
    "...\n",
    "'\n",
    '"\\ud800"\n',
    "\t",
    "\x00",
    "\ufeff",
    "key: &x [*x]\n",
    "a: 1\na: 2\n",
    "tenant: acme\n",
]
yaml_text = st.one_of(
    st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join),
    st.text(max_size=200),
    st.builds(
        lambda n, o, c: o * n + c * n,
        st.integers(1, 500),
        st.sampled_from("[{"),
        st.sampled_from("]}"),
    ),
    st.integers(1, 300).map(lambda n: "".join(f"{' ' * i}k{i}:\n" for i in range(n)) + "x"),
)

# ------------------------------------------------------------------ helpers


def load_config_doc(doc: Any) -> GatewayConfig | None:
    try:
        return parse_config(doc, "gateway.yaml", BASE) if isinstance(doc, dict) else None
    except ConfigError as exc:
        assert exc.errors and all(isinstance(e, str) and e for e in exc.errors)
        return None


def load_policy_doc(doc: Any, config: GatewayConfig) -> None:
    if not isinstance(doc, dict):
        return
    try:
        policy = validate_model(TenantPolicy, doc, "acme.yaml", BASE)
    except ConfigError as exc:
        assert exc.errors
        return
    check_policy(policy, "acme", config)
    build_policy_set([policy], config)


def via_yaml(doc: Any) -> Any:
    """The document as an operator's file would carry it, parsed back."""
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        return parse_yaml(text, "gateway.yaml")
    except ConfigError as exc:
        assert exc.errors
        return None


VALID_CONFIG = parse_config(copy.deepcopy(CONFIG), "gateway.yaml", BASE)

# ------------------------------------------------------------------ tests


def test_the_seed_documents_are_valid() -> None:
    load_policy_doc(copy.deepcopy(POLICY), VALID_CONFIG)
    assert validate_model(TenantPolicy, copy.deepcopy(POLICY), "acme.yaml", BASE).tenant == "acme"


@budget(250)
@given(text=yaml_text)
def test_any_yaml_text_is_a_mapping_or_a_config_error(text: str) -> None:
    try:
        data = parse_yaml(text, "gateway.yaml")
    except ConfigError as exc:
        assert len(exc.errors) == 1 and exc.errors[0].startswith("gateway.yaml: ")
        return
    assert isinstance(data, dict)
    load_config_doc(data)
    load_policy_doc(data, VALID_CONFIG)


@budget(250)
@given(doc=mutated(CONFIG), through_yaml=st.booleans())
def test_mutated_config_loads_or_lists_errors(doc: Any, through_yaml: bool) -> None:
    load_config_doc(via_yaml(doc) if through_yaml else doc)


@budget(250)
@given(doc=mutated(POLICY), through_yaml=st.booleans())
def test_mutated_policy_loads_or_lists_errors(doc: Any, through_yaml: bool) -> None:
    load_policy_doc(via_yaml(doc) if through_yaml else doc, VALID_CONFIG)


@budget(60)
@given(text=st.one_of(yaml_text, mutated(POLICY).map(lambda d: yaml.safe_dump(d))))
def test_policy_files_on_disk_load_or_fail_closed(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "acme.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        config = VALID_CONFIG.model_copy(update={"policies_dir": Path(folder)})
        try:
            policies = load_policies(config)
        except ConfigError as exc:
            assert exc.errors
            return
        assert set(policies.tenants) == {"acme"}


@pytest.mark.parametrize(
    "text",
    [
        "? [1]\n: 2\n",
        "d: 2001-13-45\n",
        "!!timestamp nope\n",
        "[" * 2000 + "]" * 2000,
        "a: !!binary 'x'\n",
    ],
    ids=["unhashable_key", "bad_date", "bad_timestamp_tag", "deep_nesting", "bad_binary"],
)
def test_regressions_found_by_fuzzing(text: str) -> None:
    """Each once escaped parse_yaml as TypeError/ValueError/RecursionError."""
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "gateway.yaml")
    assert info.value.errors[0].startswith("gateway.yaml: ")
