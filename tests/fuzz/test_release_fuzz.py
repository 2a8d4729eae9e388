"""Fuzz releases (spec §18): the ``releases:`` config, policies naming
``release:<name>``, and the pure assignment and gate (``gateway/core/release.py``).

Properties:

- **a consistent model or an error naming the key**: a generated ``releases:``
  section (names valid or not, routes served or not, equal arms, percents in
  and out of 0-100 and NaN, odd cohorts, gates and duplicates) over a valid
  two-upstream config loads into a model whose releases have unique names,
  two different served routes, a percent in 0-100, or fails with a
  :class:`ConfigError` whose every line names a release key; never another
  exception;
- **policies**: ``check_policy`` flags exactly the aliases naming an unknown
  release or an unserved route (``models.<alias>``), and a clean policy builds;
- **assignment**: ``canary_share`` is in ``[0, SHARES)``; ``is_canary`` is
  monotone in the percent for any release and key (never at 0, always at 100);
- **the window**: ``ArmWindow.figures`` is never negative and counts exactly
  the recorded requests and failures whose bucket is within the window; its
  p95 is the upper edge of the bin holding the true p95;
- **the gate**: ``judge`` never raises, says nothing below ``min_requests``,
  and a verdict is backed by the figures.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st

from gateway.config import GatewayConfig
from gateway.config.loader import ConfigError, parse_config, validate_model
from gateway.config.policy import TenantPolicy, build_policy_set, check_policy
from gateway.core.release import (
    BIN_FLOOR_S,
    BIN_RATIO,
    BUCKETS,
    SHARES,
    ArmWindow,
    Figures,
    GateRule,
    canary_share,
    is_canary,
    judge,
)
from tests.fuzz.budget import budget

pytestmark = pytest.mark.fuzz

BASE_DIR = Path("/nonexistent/gateway-fuzz")
R1, R2, R3 = (f"/srv/mosaic-models/{c * 64}" for c in "abc")
SERVED = (R1, R2, R3)
UNSERVED = ("/srv/mosaic-models/" + "d" * 64, "", "release:x", "/srv/")
_WORKER = {"connect_timeout_s": 2, "idle_timeout_s": 30, "max_line_bytes": 1_048_576}
CONFIG: dict[str, Any] = {
    "listen": {"host": "127.0.0.1", "port": 8443, "shutdown_grace_s": 30},
    "upstreams": [
        {**_WORKER, "name": "one", "base_url": "http://127.0.0.1:1234", "routes": [R1, R2]},
        {**_WORKER, "name": "two", "base_url": "http://127.0.0.1:1235", "routes": [R3]},
    ],
    "auth": {
        "issuers": [
            {
                "issuer": "https://dev.test",
                "audience": "mistralrs-gateway",
                "algorithms": ["HS256"],
                "hs256_secret_env": "DEV_SECRET",
            }
        ]
    },
    "policies_dir": "policies",
    "staging": {"dir": "var/evidence", "catalog": "var/c.sqlite3", "worker_media": "data_url"},
}
COHORTS = ("subject", "tenant", "request")

# ------------------------------------------------------------------ strategies

text_names = st.one_of(
    st.sampled_from(["chat", "a", "x" * 32, "v2-canary", "0"]),
    st.sampled_from(["", "Chat", "x" * 33, "bad_name", "rel:x", "🙂", " chat", "a.b"]),
    st.from_regex(r"[a-z0-9-]{1,32}", fullmatch=True),
)
names = st.one_of(text_names, st.integers(), st.none())
routes = st.one_of(st.sampled_from(SERVED), st.sampled_from(UNSERVED), st.integers(), st.none())
percents = st.one_of(
    st.floats(0, 100),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-10, 110),
    st.sampled_from([0, 100, -0.0, 100.0001, -1e-9, "50", True, None]),
)
odd = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6), st.floats())


@st.composite
def gates(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 5)) == 0:
        return draw(odd)
    gate: dict[str, Any] = {}
    for key, good in (
        ("window_s", st.floats(0.001, 1e6)),
        ("min_requests", st.integers(1, 1000)),
        ("max_failure_rate_delta", st.floats(0, 1)),
        ("max_ttft_p95_ratio", st.floats(1, 100)),
    ):
        if draw(st.booleans()):
            gate[key] = draw(st.one_of(good, good, odd, st.floats(allow_nan=True)))
    if draw(st.integers(0, 7)) == 0:
        gate[draw(st.sampled_from(["windows", "min", "x"]))] = 1
    return gate


@st.composite
def release_entries(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 15)) == 0:
        return draw(odd)
    entry: dict[str, Any] = {}
    for key, strategy in (
        ("name", names),
        ("stable", routes),
        ("canary", routes),
        ("canary_percent", percents),
        ("cohort", st.one_of(st.sampled_from([*COHORTS, "user", "Subject", ""]), odd)),
        ("fallback", st.one_of(st.booleans(), odd)),
        ("gate", gates()),
    ):
        # name/stable/canary are required: present most of the time
        if draw(st.integers(0, 9)) > (0 if key in ("name", "stable", "canary") else 4):
            entry[key] = draw(strategy)
    if draw(st.integers(0, 2)) == 0 and isinstance(entry.get("stable"), str):
        entry["canary"] = entry["stable"]  # equal arms
    if draw(st.integers(0, 9)) == 0:
        entry[draw(st.sampled_from(["percent", "routes", "Name"]))] = draw(odd)
    return entry


@st.composite
def good_entries(draw: st.DrawFn) -> dict[str, Any]:
    """A valid entry (its name may still collide with another's)."""
    stable, canary = draw(st.permutations(SERVED))[:2]
    entry: dict[str, Any] = {
        "name": draw(st.sampled_from(["chat", "v2", "x" * 32])),
        "stable": stable,
        "canary": canary,
    }
    if draw(st.booleans()):
        entry["canary_percent"] = draw(st.one_of(st.floats(0, 100), st.integers(0, 100)))
    if draw(st.booleans()):
        entry["cohort"] = draw(st.sampled_from(COHORTS))
    if draw(st.booleans()):
        entry["fallback"] = draw(st.booleans())
    if draw(st.booleans()):
        entry["gate"] = {"window_s": draw(st.floats(0.001, 1e6)), "min_requests": 3}
    return entry


@st.composite
def release_sections(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 15)) == 0:
        return draw(odd)
    # a third all valid (names may collide), the rest mixed with odd entries
    entry = st.one_of(good_entries(), release_entries())
    if draw(st.integers(0, 2)) == 0:
        entry = good_entries()
    section: list[Any] = draw(st.lists(entry, max_size=4))
    if section and draw(st.integers(0, 3)) == 0:
        section.append(copy.deepcopy(draw(st.sampled_from(section))))  # a duplicate
    return section


# ------------------------------------------------------------------ helpers


def load(section: Any, through_yaml: bool) -> GatewayConfig | None:
    doc = copy.deepcopy(CONFIG)
    doc["releases"] = section
    if through_yaml:
        try:
            doc = yaml.safe_load(yaml.safe_dump(doc, allow_unicode=True))
        except yaml.YAMLError:  # e.g. a lone surrogate in generated text: not a file
            return None
    try:
        config = parse_config(doc, "gateway.yaml", BASE_DIR)
    except ConfigError as exc:
        assert exc.errors
        for line in exc.errors:
            assert isinstance(line, str) and line.startswith("gateway.yaml: "), line
            assert "release" in line, f"an error not naming the releases key: {line}"
        return None
    return config


def assert_consistent(config: GatewayConfig) -> None:
    served = set(config.routes)
    assert served == set(SERVED)
    found = [r.name for r in config.releases]
    assert len(found) == len(set(found)), "release names unique"
    for release in config.releases:
        assert release.stable in served and release.canary in served
        assert release.stable != release.canary
        assert 0 <= release.canary_percent <= 100  # NaN fails this too
        assert release.cohort in COHORTS
        assert isinstance(release.fallback, bool)
        if release.gate is not None:
            assert release.gate.window_s > 0 and math.isfinite(release.gate.window_s)
            assert release.gate.min_requests >= 1
            assert 0 <= release.gate.max_failure_rate_delta <= 1
            assert release.gate.max_ttft_p95_ratio >= 1


def the_config(release_names: list[str]) -> GatewayConfig:
    doc = copy.deepcopy(CONFIG)
    doc["releases"] = [{"name": n, "stable": R1, "canary": R3} for n in release_names]
    return parse_config(doc, "gateway.yaml", BASE_DIR)


# ------------------------------------------------------------------ config tests


def test_the_seed_config_and_a_release_load() -> None:
    config = the_config(["chat"])
    assert_consistent(config)
    assert [r.name for r in config.releases] == ["chat"]


@budget(300)
@given(section=release_sections(), through_yaml=st.booleans())
def test_releases_load_consistently_or_fail_naming_the_key(
    section: Any, through_yaml: bool
) -> None:
    config = load(section, through_yaml)
    if config is not None:
        assert_consistent(config)
        event(f"loaded with {len(config.releases)} release(s)")
    else:
        event("refused")


@budget(150)
@given(
    known=st.lists(st.sampled_from(["chat", "v2", "x" * 32]), unique=True, max_size=3),
    models=st.dictionaries(
        st.sampled_from(["chat-model", "m2", "gemma-4-mm", "alias.with.dots"]),
        st.one_of(
            st.sampled_from(["release:chat", "release:v2", "release:", "release:nope"]),
            st.sampled_from(["release:" + "x" * 32, "release:CHAT", "release:chat "]),
            st.sampled_from([*SERVED, *UNSERVED[:2]]),
        ),
        max_size=4,
    ),
)
def test_policies_naming_releases_are_checked_by_alias(
    known: list[str], models: dict[str, str]
) -> None:
    config = the_config(known)
    doc = {"tenant": "acme", "models": models, "endpoints": ["chat.completions"]}
    try:
        policy = validate_model(TenantPolicy, doc, "acme.yaml", BASE_DIR)
    except ConfigError as exc:
        assert exc.errors and all(e.startswith("acme.yaml: ") for e in exc.errors)
        return
    problems = check_policy(policy, "acme", config)
    releases = {"release:" + n for n in known}
    expected = {
        f"models.{alias}"
        for alias, route in models.items()
        if (route not in releases if route.startswith("release:") else route not in SERVED)
    }
    assert {key for key, _ in problems} == expected, problems
    event(f"{len(problems)} problem(s)")
    if not problems:
        built = build_policy_set([policy], config)
        assert set(built.tenants) == {"acme"}


# ------------------------------------------------------------------ assignment

keys = st.one_of(st.text(max_size=40), st.sampled_from(["", "acme\nuser-1", "\x00", "🙂"]))


@budget(400)
@given(
    release=st.one_of(text_names, st.text(max_size=8)),
    key=keys,
    p1=st.floats(0, 100),
    p2=st.floats(0, 100),
)
def test_assignment_is_in_range_and_monotone_in_percent(
    release: str, key: str, p1: float, p2: float
) -> None:
    share = canary_share(release, key)
    assert 0 <= share < SHARES
    assert share == canary_share(release, key), "sticky"
    low, high = sorted((p1, p2))
    assert not is_canary(release, key, 0)
    assert is_canary(release, key, 100)
    if is_canary(release, key, low):
        assert is_canary(release, key, high), (low, high)
    assert is_canary(release, key, high) == (share < round(high * 100))


# ------------------------------------------------------------------ the window

records = st.lists(
    st.tuples(
        st.floats(0, 50),  # time step from the previous record
        st.booleans(),  # failed
        st.one_of(st.none(), st.floats(0, 100)),  # ttft_s
    ),
    max_size=60,
)


@budget(300)
@given(
    window_s=st.floats(0.05, 500),
    start=st.floats(0, 1e6),
    steps=records,
    tail=st.floats(0, 1000),
)
def test_window_figures_count_exactly_the_records_in_the_window(
    window_s: float,
    start: float,
    steps: list[tuple[float, bool, float | None]],
    tail: float,
) -> None:
    window = ArmWindow(window_s)
    at = start
    seen: list[tuple[float, bool, float | None]] = []
    for step, failed, ttft in steps:
        at += step
        window.record(at, failed, ttft)
        seen.append((at, failed, ttft))
        figures = window.figures(at)
        assert figures.requests >= figures.failures >= 0
    now = at + tail
    figures = window.figures(now)
    width = window_s / BUCKETS
    epoch = int(now / width)
    live = [r for r in seen if epoch - BUCKETS < int(r[0] / width) <= epoch]
    assert figures.requests == len(live)
    assert figures.failures == sum(1 for r in live if r[1])
    assert 0.0 <= figures.failure_rate <= 1.0
    ttfts = sorted(r[2] for r in live if r[2] is not None)
    if not ttfts:
        assert figures.ttft_p95_s is None
        return
    assert figures.ttft_p95_s is not None and figures.ttft_p95_s > 0
    true_p95 = ttfts[math.ceil(0.95 * len(ttfts)) - 1]
    edge = figures.ttft_p95_s
    assert edge >= true_p95 * (1 - 1e-9), (edge, true_p95)
    assert edge <= max(true_p95 * BIN_RATIO, BIN_FLOOR_S) * (1 + 1e-9), (edge, true_p95)
    assert figures.to_json()["requests"] == len(live)


# ------------------------------------------------------------------ the gate


@st.composite
def figures(draw: st.DrawFn) -> Figures:
    requests = draw(st.integers(0, 10_000))
    failures = draw(st.integers(0, requests))
    p95 = draw(st.one_of(st.none(), st.floats(0, 1e4), st.just(float("inf"))))
    return Figures(requests, failures, p95)


@budget(400)
@given(
    rule=st.builds(
        GateRule,
        min_requests=st.integers(1, 1000),
        max_failure_rate_delta=st.floats(0, 1),
        max_ttft_p95_ratio=st.floats(1, 1e3),
    ),
    stable=figures(),
    canary=figures(),
)
def test_judge_never_raises_and_its_verdict_is_backed(
    rule: GateRule, stable: Figures, canary: Figures
) -> None:
    verdict = judge(rule, stable, canary)
    assert verdict in (None, "failure_rate", "ttft_p95")
    if min(stable.requests, canary.requests) < rule.min_requests:
        assert verdict is None
    elif verdict == "failure_rate":
        assert canary.failure_rate - stable.failure_rate > rule.max_failure_rate_delta
    elif verdict == "ttft_p95":
        assert canary.ttft_p95_s is not None and stable.ttft_p95_s is not None
        assert canary.ttft_p95_s > rule.max_ttft_p95_ratio * stable.ttft_p95_s
    else:
        assert canary.failure_rate - stable.failure_rate <= rule.max_failure_rate_delta
