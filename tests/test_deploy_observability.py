"""deploy/observability/: the PodMonitor, alert rules and Grafana dashboard speak the
gateway's metrics.

Every PromQL expression is read with a small extractor (no PromQL library in the
stack): string literals, ranges and ``$variables`` are taken out, ``name{…}``
selectors and ``by/without/on/ignoring (…)`` clauses give label names, and every
identifier left that is not a function or keyword is a metric name. Names must be
samples the gateway's own registry exposes (``_total``, ``_bucket``, ``_sum``,
``_count`` included); labels must be labels of those samples, or ones the scrape
adds. The extractor is itself tested on expressions that must fail.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from gateway.config import GatewayConfig
from gateway.config.loader import load_config
from gateway.observe.histogram import FastHistogram
from gateway.observe.metrics import GatewayMetrics

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
OBSERVABILITY = DEPLOY / "observability"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"

Doc = dict[str, Any]

#: labels Prometheus (prometheus-operator, PodMonitor) attaches to every scraped series
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "endpoint"})
#: series Prometheus writes itself, about the scrape
PROMETHEUS_OWN = {"up": frozenset[str]()}

_FUNCTIONS = frozenset(
    {
        "abs", "absent", "avg", "avg_over_time", "bottomk", "ceil", "clamp_max", "clamp_min",
        "count", "count_over_time", "delta", "deriv", "floor", "group", "histogram_quantile",
        "increase", "irate", "label_replace", "max", "max_over_time", "min", "min_over_time",
        "quantile", "rate", "round", "scalar", "sort", "stddev", "sum", "time", "topk", "vector",
    }
)  # fmt: skip
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def registry_samples() -> dict[str, frozenset[str]]:
    """Sample name -> its label names, as the gateway's registry exposes them.

    A labelled metric has no samples until a child exists, so one child per
    metric is made (label count from prometheus_client's wrapper); the names and
    labels themselves come from the registry's own collection."""
    metrics = GatewayMetrics()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase) and value._labelnames:
            value.labels(*("x" for _ in value._labelnames))
        elif isinstance(value, FastHistogram) and value.labelnames:
            value.labels(*("x" for _ in value.labelnames))
    samples: dict[str, set[str]] = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in samples.items()}


REGISTRY = registry_samples()

#: the release metrics (spec §18, and the gates' rollbacks) as samples: name -> labels
RELEASE_SAMPLES = {
    "gateway_release_requests_total": frozenset({"release", "arm", "outcome"}),
    "gateway_release_ttft_seconds_bucket": frozenset({"release", "arm", "le"}),
    "gateway_release_canary_percent": frozenset({"release"}),
    "gateway_release_rollbacks_total": frozenset({"release"}),
}


@dataclass
class Usage:
    metrics: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def check_promql(expr: str) -> Usage:
    """The metric names an expression uses, and what in it the registry does not have."""
    known = {**REGISTRY, **PROMETHEUS_OWN}
    usage = Usage()
    selector_labels: list[tuple[str, str]] = []
    for name, body in _SELECTOR.findall(expr):
        selector_labels += [(name, label) for label in _MATCHER.findall(body)]
    grouping = [
        label.strip()
        for _, labels in _GROUPING.findall(expr)
        for label in labels.split(",")
        if label.strip()
    ]
    rest = _STRING.sub(" ", expr)
    rest = re.sub(r"\{[^}]*\}", " ", rest)
    rest = re.sub(r"\[[^\]]*\]", " ", rest)
    rest = re.sub(r"\$\{?\w+\}?", " ", rest)
    rest = _GROUPING.sub(" ", rest)
    for match in _IDENT.finditer(rest):
        word = match.group()
        called = rest[match.end() :].lstrip().startswith("(")
        if word in _KEYWORDS or (called and word in _FUNCTIONS):
            continue
        if called:
            usage.problems.append(f"unknown function {word}")
        elif word not in known:
            usage.problems.append(f"unknown metric {word}")
        else:
            usage.metrics.add(word)
    if not usage.metrics:
        usage.problems.append("no metric found")
    for name, label in selector_labels:
        if name in known and label not in known[name] | TARGET_LABELS:
            usage.problems.append(f"{name} has no label {label}")
    for label in grouping:
        for name in usage.metrics:
            if label not in known[name] | TARGET_LABELS:
                usage.problems.append(f"grouping by {label}: {name} has no such label")
    return usage


# --- the checker itself ------------------------------------------------------------------


def test_the_registry_has_what_the_spec_names() -> None:
    assert {
        "gateway_requests_total",
        "gateway_ttft_seconds_bucket",
        "gateway_ttft_seconds_sum",
        "gateway_ttft_seconds_count",
        "gateway_upstream_ready",
        "gateway_limits_store_errors_total",
    } <= set(REGISTRY)
    assert REGISTRY["gateway_requests_total"] == {"tenant", "endpoint", "status"}
    assert REGISTRY["gateway_upstream_ready"] == {"upstream", "route"}
    assert REGISTRY["gateway_limits_store_seconds_bucket"] == {"op", "le"}
    # Releases (spec §18), with the labels the spec gives them.
    for name, labels in RELEASE_SAMPLES.items():
        assert REGISTRY.get(name) == labels, name


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("sum(rate(gateway_request_total[5m]))", "unknown metric gateway_request_total"),
        ('gateway_requests_total{route="x"}', "has no label route"),
        (
            "histogram_quantile(0.9, sum by (le, upstream) "
            "(rate(gateway_ttft_seconds_bucket[5m])))",
            "grouping by upstream",
        ),
        ("gateway_ttft_seconds > 1", "unknown metric gateway_ttft_seconds"),  # family, no sample
        ("sum(rat(gateway_requests_total[5m]))", "unknown function rat"),
        ("1 > 0", "no metric found"),
    ],
)
def test_the_checker_catches(expr: str, problem: str) -> None:
    problems = check_promql(expr).problems
    assert any(problem in p for p in problems), problems


def test_the_checker_passes_what_is_right() -> None:
    usage = check_promql(
        'sum by (namespace, status) (rate(gateway_requests_total{namespace=~"$namespace",'
        ' status=~"5.."}[$__rate_interval])) / on (namespace) group_left '
        "sum by (namespace) (rate(gateway_requests_total[5m])) > 0.05"
    )
    assert usage.problems == []
    assert usage.metrics == {"gateway_requests_total"}


# --- the Grafana dashboard -------------------------------------------------------------


@pytest.fixture(scope="module")
def dashboard() -> Doc:
    parsed: Doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return parsed


def graph_panels(dashboard: Doc) -> list[Doc]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_dashboard_parses_and_every_panel_has_a_target(dashboard: Doc) -> None:
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    panels = graph_panels(dashboard)
    assert len(panels) >= 10
    for panel in panels:
        assert panel["title"] and panel["description"], panel["id"]
        targets = panel["targets"]
        assert targets, panel["title"]
        refs = [t["refId"] for t in targets]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in targets:
            assert target["expr"].strip(), panel["title"]
        # The data source is chosen at import (variable), never a uid of someone's Grafana.
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_dashboard_panels_do_not_overlap(dashboard: Doc) -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, (panel["title"], taken.get((x, y)))
                taken[(x, y)] = panel["title"]


def dashboard_exprs(dashboard: Doc) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in graph_panels(dashboard) for t in p["targets"]]


def test_every_dashboard_metric_and_label_is_in_the_registry(dashboard: Doc) -> None:
    problems = [
        f"{title}: {problem}"
        for title, expr in dashboard_exprs(dashboard)
        for problem in check_promql(expr).problems
    ]
    assert problems == []


def test_dashboard_variables_query_real_metrics(dashboard: Doc) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    query = variables["namespace"]["query"]["query"]
    match = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query)
    assert match, query
    assert match[1] in REGISTRY and match[2] in REGISTRY[match[1]] | TARGET_LABELS


def test_dashboard_shows_what_operators_need(dashboard: Doc) -> None:
    used = {m for _, expr in dashboard_exprs(dashboard) for m in check_promql(expr).metrics}
    assert {
        "gateway_requests_total",  # by status
        "gateway_ttft_seconds_bucket",  # quantiles
        "gateway_stream_outcomes_total",
        "gateway_tokens_total",  # by tenant
        "gateway_permits_in_use",  # per upstream
        "gateway_admission_queue_depth",  # per upstream
        "gateway_upstream_ready",  # per route
        "gateway_receipt_errors_total",
        "gateway_receipts_lost_total",
        "gateway_limits_store_seconds_bucket",
        "gateway_limits_store_errors_total",
        "gateway_limits_store_healthy",
        "gateway_auth_failures_total",
    } <= used
    grouped = " ".join(expr for _, expr in dashboard_exprs(dashboard))
    for clause in ("by (status)", "by (tenant, kind)", "by (upstream, route)", "by (upstream)"):
        assert clause in grouped, clause
    ttft = [e for _, e in dashboard_exprs(dashboard) if "gateway_ttft_seconds_bucket" in e]
    assert all(e.startswith("histogram_quantile(") for e in ttft) and len(ttft) >= 3


def row_panels(dashboard: Doc, title: str) -> list[Doc]:
    """The panels under the row of that title, up to the next row."""
    panels: list[Doc] = dashboard["panels"]
    (start,) = [i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title]
    under = []
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        under.append(panel)
    return under


def test_dashboard_has_a_releases_row_by_arm(dashboard: Doc) -> None:
    panels = row_panels(dashboard, "Releases")
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    used = {m for expr in exprs for m in check_promql(expr).metrics}
    # Only release metrics the gateway registers (the registry test above pins them).
    assert used == set(RELEASE_SAMPLES)
    assert all(check_promql(expr).problems == [] for expr in exprs)
    (requests,) = [e for e in exprs if "gateway_release_requests_total" in e]
    assert requests.startswith("sum by (release, arm, outcome) (rate(")
    (ttft,) = [e for e in exprs if "gateway_release_ttft_seconds_bucket" in e]
    assert ttft.startswith("histogram_quantile(0.95, sum by (le, release, arm) (rate(")
    assert any("gateway_release_canary_percent" in e for e in exprs)
    # The arms are told apart in each panel's legend, side by side in one row.
    for panel in panels:
        legends = [t["legendFormat"] for t in panel["targets"]]
        assert all("{{release}}" in legend for legend in legends), panel["title"]
    arms = [p for p in panels if all("{{arm}}" in t["legendFormat"] for t in p["targets"])]
    assert len(arms) >= 2
    assert len({p["gridPos"]["y"] for p in arms}) == 1, "requests and TTFT side by side"


def test_dashboard_has_an_images_and_speech_row(dashboard: Doc) -> None:
    panels = row_panels(dashboard, "Images and speech")
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert len(panels) == 2 and all(check_promql(e).problems == [] for e in exprs)
    assert all('endpoint=~"images|speech"' in e for e in exprs)
    assert {m for e in exprs for m in check_promql(e).metrics} == {
        "gateway_requests_total",
        "gateway_request_duration_seconds_bucket",
    }
    assert all("{{endpoint}}" in t["legendFormat"] for p in panels for t in p["targets"])


# --- alert rules -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config() -> GatewayConfig:
    return load_config(DEPLOY / "gateway.yaml")


@pytest.fixture(scope="module")
def rules() -> list[Doc]:
    doc = yaml.safe_load((OBSERVABILITY / "prometheus-rule.yaml").read_text(encoding="utf-8"))
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "PrometheusRule"
    found: list[Doc] = [rule for group in doc["spec"]["groups"] for rule in group["rules"]]
    return found


def alert(rules: list[Doc], name: str) -> Doc:
    (found,) = [r for r in rules if r["alert"] == name]
    return found


def test_every_alert_metric_and_label_is_in_the_registry(rules: list[Doc]) -> None:
    problems = [
        f"{rule['alert']}: {problem}"
        for rule in rules
        for problem in check_promql(rule["expr"]).problems
    ]
    assert problems == []


def test_every_alert_is_actionable(rules: list[Doc]) -> None:
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    deploy_doc = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "\n## Alerts\n" in deploy_doc
    for rule in rules:
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        assert annotations["runbook"] == "docs/deploy.md#alerts"
        # docs/deploy.md says what each one means and what to check.
        assert f"`{rule['alert']}`" in deploy_doc, rule["alert"]


def test_alerts_cover_the_failure_modes(rules: list[Doc]) -> None:
    by_metric: dict[str, list[str]] = {}
    for rule in rules:
        for metric in check_promql(rule["expr"]).metrics:
            by_metric.setdefault(metric, []).append(rule["alert"])
    for metric in (
        "gateway_upstream_ready",  # not ready (listing or probe)
        "gateway_receipt_errors_total",
        "gateway_receipts_lost_total",
        "gateway_requests_total",  # 5xx rate
        "gateway_admission_queue_depth",  # saturation
        "gateway_limits_store_errors_total",
        "gateway_limits_store_healthy",
        "up",
    ):
        assert metric in by_metric, metric
    five = alert(rules, "MistralrsGatewayHigh5xxRate")["expr"]
    assert 'status=~"5.."' in five
    assert 'endpoint!~"health|metrics"' in five  # an unready pod's /readyz 503s are no answers


def test_a_gate_rollback_alerts(rules: list[Doc]) -> None:
    rule = alert(rules, "MistralrsGatewayReleaseRolledBack")
    expr = " ".join(rule["expr"].split())
    assert check_promql(expr).metrics == {"gateway_release_rollbacks_total"}
    assert "(increase(gateway_release_rollbacks_total[10m])) > 0" in expr
    assert "release" in _GROUPING.findall(expr)[0][1], "names the release"
    assert "{{ $labels.release }}" in rule["annotations"]["summary"]


def threshold(expr: str) -> float:
    match = re.search(r"(?:>=|>)\s*([0-9.]+)\s*$", expr.strip())
    assert match, expr
    return float(match[1])


def test_alert_thresholds_follow_gateway_yaml(rules: list[Doc], config: GatewayConfig) -> None:
    queue = alert(rules, "MistralrsGatewayAdmissionQueueSaturated")["expr"]
    assert threshold(queue) == config.admission.max_queue * 3 / 4
    slow = alert(rules, "MistralrsGatewayLimitsStoreSlow")["expr"]
    assert threshold(slow) == config.limits_store.timeout_ms / 2 / 1000


# --- the PodMonitor and the kustomization ------------------------------------------------


def test_pod_monitor_scrapes_the_metrics_port(rules: list[Doc], config: GatewayConfig) -> None:
    monitor = yaml.safe_load((OBSERVABILITY / "pod-monitor.yaml").read_text(encoding="utf-8"))
    assert monitor["kind"] == "PodMonitor"
    k8s = [d for d in yaml.safe_load_all((DEPLOY / "k8s.yaml").read_text(encoding="utf-8")) if d]
    (deployment,) = [d for d in k8s if d["kind"] == "Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (gateway,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "gateway"
    ]
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert config.metrics.listen is not None
    assert ports[endpoint["port"]] == config.metrics.listen.port
    assert endpoint["path"] == config.metrics.path
    assert endpoint["scheme"] == "http"  # the metrics listener speaks plain HTTP
    # The job the scrape-down alert selects is the pod label the PodMonitor names.
    job = labels[monitor["spec"]["jobLabel"]]
    assert f'up{{job="{job}"}}' in alert(rules, "MistralrsGatewayScrapeDown")["expr"]


def test_observability_kustomization() -> None:
    kustomization = yaml.safe_load(
        (OBSERVABILITY / "kustomization.yaml").read_text(encoding="utf-8")
    )
    assert kustomization["resources"] == ["pod-monitor.yaml", "prometheus-rule.yaml"]
    (dashboards,) = kustomization["configMapGenerator"]
    assert dashboards["files"] == [DASHBOARD.name]
    assert dashboards["options"]["labels"] == {"grafana_dashboard": "1"}
    assert dashboards["options"]["disableNameSuffixHash"] is True
    # Kept out of the main kustomization: its CRDs may not exist in every cluster.
    main = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    assert not any("observability" in r for r in main["resources"])


def test_dashboard_has_an_agents_row(dashboard: Doc) -> None:
    panels = row_panels(dashboard, "Agents")
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    assert len(panels) == 3 and all(check_promql(e).problems == [] for e in exprs)
    assert {m for e in exprs for m in check_promql(e).metrics} == {
        "gateway_agent_tool_calls_total",
        "gateway_agent_rounds_bucket",
        "gateway_agent_files_dropped_total",
    }
