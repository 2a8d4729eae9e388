"""deploy/, Dockerfile and .dockerignore hold the invariants the gateway relies on.

Only what the loader validates is loaded: TLS and JWKS files are Secrets in the
pod and do not exist in the repository. The observability manifests (PodMonitor,
alert rules, dashboard) are checked against the metrics registry in
test_deploy_observability.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from redis import Redis
from redis.exceptions import RedisError

from gateway.config import GatewayConfig, UpstreamConfig
from gateway.config.loader import Loaded, load_all, policy_files
from gateway.http.runtime import shutdown_bound_s
from gateway.ratelimit import RedisLimitsStore, TenantLimits
from gateway.tools.kustomize import policies_generator
from gateway.upstream.launch import build_plan, check_argv, launch_plan_json
from tests.support.redis import REDIS_SERVER, free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CONFIG_DIR_IN_POD = PurePosixPath("/etc/mistralrs-gateway")
CONFIG_IN_POD = CONFIG_DIR_IN_POD / "gateway.yaml"
APP = {"app.kubernetes.io/name": "mistralrs-gateway"}
#: the example pod's workers (gateway.yaml upstreams), each in container worker-<name>
UPSTREAMS = ("chat", "embed")
CONTAINERS = ("gateway", *(f"worker-{name}" for name in UPSTREAMS))
MODELS_PVC = "mosaic-models"
AUDIT_PVC = "mistralrs-gateway-audit"
EVIDENCE_PVC = "mistralrs-gateway-evidence"
STATE_SECRET = "mistralrs-gateway-state"

Doc = dict[str, Any]


def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


@pytest.fixture(scope="module")
def loaded() -> Loaded:
    return load_all(DEPLOY / "gateway.yaml")


@pytest.fixture(scope="module")
def config(loaded: Loaded) -> GatewayConfig:
    return loaded.config


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    text = (DEPLOY / "k8s.yaml").read_text(encoding="utf-8")
    return [d for d in yaml.safe_load_all(text) if d is not None]


def only(docs: list[Doc], kind: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module")
def redis_docs() -> list[Doc]:
    text = (DEPLOY / "redis.yaml").read_text(encoding="utf-8")
    return [d for d in yaml.safe_load_all(text) if d is not None]


@pytest.fixture(scope="module")
def deployment(docs: list[Doc]) -> Doc:
    return only(docs, "Deployment")


@pytest.fixture(scope="module")
def pod(deployment: Doc) -> Doc:
    spec: Doc = deployment["spec"]["template"]["spec"]
    return spec


def upstream(config: GatewayConfig, name: str) -> UpstreamConfig:
    (found,) = [u for u in config.workers if u.name == name]
    return found


def workers(pod: Doc) -> list[Doc]:
    return [c for c in pod["containers"] if c["name"].startswith("worker-")]


def container(pod: Doc, name: str) -> Doc:
    found = [c for c in pod["containers"] if c["name"] == name]
    assert len(found) == 1
    result: Doc = found[0]
    return result


def volumes(pod: Doc) -> dict[str, Doc]:
    return {v["name"]: v for v in pod["volumes"]}


def mounts(c: Doc) -> dict[str, Doc]:
    return {m["mountPath"]: m for m in c.get("volumeMounts", [])}


def in_pod(config_path: Path) -> PurePosixPath:
    """Where a file the config names locally (under deploy/) sits in the pod."""
    if config_path.is_absolute() and not config_path.is_relative_to(DEPLOY):
        return PurePosixPath(config_path)
    return CONFIG_DIR_IN_POD / config_path.relative_to(DEPLOY).as_posix()


def covering_mount(c: Doc, path: PurePosixPath) -> Doc:
    """The deepest mount holding path (nested mounts shadow their parents)."""
    best: Doc | None = None
    for mount_path, mount in mounts(c).items():
        inside = path == PurePosixPath(mount_path) or path.is_relative_to(mount_path)
        if inside and (best is None or len(mount_path) > len(best["mountPath"])):
            best = mount
    assert best is not None, f"{path} is on no volume of {c['name']}"
    return best


# --- every file parses; the example config loads -------------------------------------


def test_every_yaml_in_deploy_parses() -> None:
    files = yaml_files()
    assert {p.relative_to(DEPLOY).as_posix() for p in files} >= {
        "gateway.yaml",
        "k8s.yaml",
        "kustomization.yaml",
        "policies-generator.yaml",
        "policies/acme.yaml",
        "policies/globex.yaml",
        "redis.yaml",
        "observability/kustomization.yaml",
        "observability/pod-monitor.yaml",
        "observability/prometheus-rule.yaml",
    }
    for path in files:
        parsed = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        assert parsed, path


def test_example_config_and_policies_load(loaded: Loaded, config: GatewayConfig) -> None:
    assert loaded.warnings == ()
    assert set(loaded.policies.tenants) == {"acme", "globex"}
    assert config.listen.host == "0.0.0.0"
    assert config.listen.port == 8443
    assert config.listen.tls is not None
    assert config.upstream is None
    assert tuple(u.name for u in config.workers) == UPSTREAMS
    for path in (config.staging.dir, config.staging.catalog, config.audit.path):
        assert PurePosixPath(path).is_relative_to("/var/lib/mistralrs-gateway")


@pytest.mark.parametrize("name", UPSTREAMS)
def test_each_worker_is_pinned_on_its_own_loopback_port(config: GatewayConfig, name: str) -> None:
    worker = upstream(config, name)
    launch = worker.launch
    assert launch is not None
    url = urlsplit(worker.base_url)
    assert (url.scheme, url.hostname, url.port) == ("http", "127.0.0.1", launch.port)
    # The route is the worker's -m: the bundle directory named by its digest.
    assert worker.served_routes == launch.model_dirs == [launch.model_dir]
    assert launch.model_dir == f"/srv/mosaic-models/{launch.model_bundle_sha256}"
    capacity = worker.capacity or config.admission.capacity
    assert capacity <= launch.max_seqs  # a permit never waits inside the worker


def test_worker_ports_do_not_collide_in_the_pod(config: GatewayConfig) -> None:
    # One network namespace: a worker on the gateway's or the metrics port would not bind.
    assert config.metrics.listen is not None
    ports = [u.launch.port for u in config.workers if u.launch is not None]
    ports += [config.listen.port, config.metrics.listen.port]
    assert len(ports) == len(set(ports)) == len(UPSTREAMS) + 2


def test_the_embedding_worker_is_probed_with_an_embedding(config: GatewayConfig) -> None:
    chat, embed = upstream(config, "chat"), upstream(config, "embed")
    assert chat.probe is not None and chat.probe.kind == "chat"
    assert embed.probe is not None and embed.probe.kind == "embeddings"
    assert embed.launch is not None and embed.launch.device == "cpu"


def test_policies_alias_both_workers_with_the_endpoints_they_serve(
    loaded: Loaded, config: GatewayConfig
) -> None:
    aliased: set[str] = set()
    for tenant in loaded.policies.tenants.values():
        for route in tenant.policy.models.values():
            aliased.add(route)
            serving = config.routes[route].name
            if serving == "embed":
                assert tenant.allows_endpoint("embeddings"), (tenant.name, route)
            else:
                assert tenant.allows_endpoint("chat.completions"), (tenant.name, route)
    assert aliased == set(config.routes)  # every route some tenant can reach


# --- the pod ---------------------------------------------------------------------------


def test_one_pod_a_gateway_and_a_container_per_worker(deployment: Doc, pod: Doc) -> None:
    assert deployment["spec"]["selector"]["matchLabels"] == APP
    assert deployment["spec"]["template"]["metadata"]["labels"] == APP
    assert tuple(c["name"] for c in pod["containers"]) == CONTAINERS
    assert pod["automountServiceAccountToken"] is False
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")


def test_gateway_command(pod: Doc) -> None:
    gateway = container(pod, "gateway")
    assert gateway["command"] + gateway["args"] == [
        "mistralrs-gateway",
        "serve",
        "--config",
        str(CONFIG_IN_POD),
    ]


@pytest.mark.parametrize("name", UPSTREAMS)
def test_each_worker_runs_exactly_its_launch_plan(
    pod: Doc, config: GatewayConfig, name: str
) -> None:
    launch = upstream(config, name).launch
    assert launch is not None
    plan = build_plan(launch)
    # What `launch-plan` prints for this upstream, the container's argv token for token.
    assert launch_plan_json(config)["upstreams"][name]["argv"] == plan.argv
    worker = container(pod, f"worker-{name}")
    argv = worker["command"] + worker["args"]
    assert argv == plan.argv
    assert all(isinstance(token, str) for token in argv)  # "1234" and "off" quoted
    i = argv.index("--host")
    assert argv[i : i + 2] == ["--host", "127.0.0.1"]
    assert argv[argv.index("--port") + 1] == str(launch.port)
    check_argv(argv)


def test_every_upstream_has_its_container(pod: Doc, config: GatewayConfig) -> None:
    launched = {u.name for u in config.workers if u.launch is not None}
    assert {c["name"] for c in workers(pod)} == {f"worker-{n}" for n in launched}


def test_workers_expose_nothing(pod: Doc) -> None:
    for worker in workers(pod):
        assert "ports" not in worker, worker["name"]
        # Kubelet probes reach the pod IP, which a loopback-only worker never answers.
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert probe not in worker, (worker["name"], probe)


def test_no_agent_flags_anywhere(pod: Doc) -> None:
    pattern = re.compile(
        r"^(-l|--log|--ui|--agent.*|--enable-.*|--sandbox.*|--mcp.*|--lora|--max-tool-rounds"
        r"|--tool-dispatch-url|--search.*|--code-exec.*|--shell.*|--skills.*)(=.*)?$"
    )
    for c in pod["containers"]:
        for token in c.get("command", []) + c.get("args", []):
            assert not pattern.match(str(token)), (c["name"], token)
        for env in c.get("env", []):
            assert env["name"] not in ("MCP_CONFIG_PATH", "MISTRALRS_ALLOW_RUNTIME_LORA_UPDATING")


def test_gateway_ports_and_probes(pod: Doc, config: GatewayConfig) -> None:
    gateway = container(pod, "gateway")
    assert config.metrics.listen is not None
    ports = {p["name"]: p for p in gateway["ports"]}
    assert [(p["containerPort"], p["protocol"]) for p in gateway["ports"]] == [
        (config.listen.port, "TCP"),
        (config.metrics.listen.port, "TCP"),
    ]
    assert ports["https"]["containerPort"] == config.listen.port == 8443
    assert ports["metrics"]["containerPort"] == config.metrics.listen.port
    assert config.metrics.listen.host == "0.0.0.0"  # the scraper comes from another pod
    expected = {"startupProbe": "/livez", "livenessProbe": "/livez", "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        get = gateway[probe]["httpGet"]
        assert get["path"] == path
        assert get["scheme"] == "HTTPS"
        assert get["port"] in ("https", 8443)


@pytest.mark.parametrize("name", CONTAINERS)
def test_container_security(pod: Doc, name: str) -> None:
    ctx = container(pod, name)["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert isinstance(ctx["runAsUser"], int) and ctx["runAsUser"] > 0
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx.get("privileged", False) is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert "add" not in ctx["capabilities"]
    assert ctx["seccompProfile"]["type"] == "RuntimeDefault"


def test_pod_security(pod: Doc) -> None:
    ctx = pod["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["seccompProfile"]["type"] == "RuntimeDefault"


def test_containers_use_distinct_uids(pod: Doc) -> None:
    uids = {c["securityContext"]["runAsUser"] for c in pod["containers"]}
    assert len(uids) == len(CONTAINERS)


@pytest.mark.parametrize("name", CONTAINERS)
def test_resources(pod: Doc, name: str) -> None:
    resources = container(pod, name)["resources"]
    assert resources["requests"]["memory"] and resources["requests"]["cpu"]
    assert resources["limits"]["memory"]


@pytest.mark.parametrize("name", UPSTREAMS)
def test_only_a_cuda_worker_takes_a_gpu(pod: Doc, config: GatewayConfig, name: str) -> None:
    launch = upstream(config, name).launch
    assert launch is not None
    limits = container(pod, f"worker-{name}")["resources"]["limits"]
    assert ("nvidia.com/gpu" in limits) == (launch.device == "cuda")
    assert limits.get("nvidia.com/gpu", 1) == 1
    assert "nvidia.com/gpu" not in container(pod, "gateway")["resources"]["limits"]


def test_grace_period_outlasts_the_drain(pod: Doc, config: GatewayConfig) -> None:
    grace = pod["terminationGracePeriodSeconds"]
    # Every bounded wait of a SIGTERM fits, every store failing at once included.
    assert grace >= shutdown_bound_s(config) > config.listen.shutdown_grace_s
    # Each worker's SIGTERM waits for the drain but not for the whole grace period.
    for worker in workers(pod):
        sleep = worker["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert config.listen.shutdown_grace_s <= sleep < grace, worker["name"]


def test_images_are_pinned(pod: Doc) -> None:
    for c in pod["containers"]:
        image = c["image"]
        name = image.split("@", 1)[0]
        assert ":" in name.rsplit("/", 1)[-1], image
        assert not name.endswith(":latest"), image
    for worker in workers(pod):
        assert re.search(r"@sha256:[0-9a-f]{64}$", worker["image"]), worker["name"]


# --- replicas, disruptions, rollouts ---------------------------------------------------


def test_replicas_and_a_rolling_update_that_keeps_capacity(deployment: Doc) -> None:
    spec = deployment["spec"]
    assert spec["replicas"] >= 2
    strategy = spec["strategy"]
    assert strategy["type"] == "RollingUpdate"
    # The new pod first, an old one drained only once it is ready: never fewer than replicas.
    assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert spec["minReadySeconds"] > 0
    # Long enough for a model load, and for a surge pod waiting for a GPU node to join.
    assert spec["progressDeadlineSeconds"] >= 600


def test_pod_disruption_budget_selects_the_pod(docs: list[Doc], deployment: Doc) -> None:
    budget = only(docs, "PodDisruptionBudget")
    assert budget["apiVersion"] == "policy/v1"
    spec = budget["spec"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["selector"] == deployment["spec"]["selector"]
    # One voluntary eviction at a time, whatever the replica count.
    assert spec["maxUnavailable"] == 1 and "minAvailable" not in spec
    assert spec["maxUnavailable"] < deployment["spec"]["replicas"]  # drains can proceed
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_replicas_spread_over_nodes(pod: Doc) -> None:
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["maxSkew"] == 1
    assert spread["labelSelector"] == {"matchLabels": APP}
    # DoNotSchedule would count GPU-less nodes as empty domains and block the surge pod.
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"


# --- volumes ---------------------------------------------------------------------------


def test_writable_paths_are_volumes(pod: Doc, config: GatewayConfig) -> None:
    gateway = container(pod, "gateway")
    vols = volumes(pod)
    for path in (
        PurePosixPath(config.staging.dir),
        PurePosixPath(config.staging.catalog).parent,
        PurePosixPath(config.audit.path).parent,
    ):
        mount = covering_mount(gateway, path)
        assert not mount.get("readOnly", False), path
        # subPath would pin one file name; rotation renames files within the directory.
        assert "subPath" not in mount
        source = vols[mount["name"]]
        assert "emptyDir" in source or "persistentVolumeClaim" in source


def claim_named(docs: list[Doc], name: str) -> Doc:
    (pvc,) = [
        d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == name
    ]
    return pvc


def quantity(text: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti)", text)
    assert match, text
    return int(match[1]) * units[match[2]]


def test_receipts_go_to_a_directory_of_the_pods_own_on_shared_storage(
    docs: list[Doc], deployment: Doc, pod: Doc, config: GatewayConfig
) -> None:
    gateway = container(pod, "gateway")
    audit_dir = PurePosixPath(config.audit.path).parent
    mount = covering_mount(gateway, audit_dir)
    assert mount["mountPath"] == str(audit_dir)
    # Each replica appends only to <volume>/<pod name>/: no file has two writers.
    assert mount["subPathExpr"] == "$(POD_NAME)"
    env = {e["name"]: e for e in gateway["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    claim = volumes(pod)[mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == AUDIT_PVC
    pvc = claim_named(docs, claim)
    # Mounted by every replica and the surge pod, on whatever nodes they land.
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    # Rotation bounds each pod's files; the volume holds every live pod's full set.
    assert config.audit.rotate_bytes > 0 and config.audit.keep >= 1
    per_pod = (config.audit.keep + 1) * config.audit.rotate_bytes
    live = (
        deployment["spec"]["replicas"] + deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"]
    )
    assert live * per_pod <= quantity(pvc["spec"]["resources"]["requests"]["storage"])
    # No other container sees the receipts.
    for worker in workers(pod):
        assert mount["name"] not in {m["name"] for m in worker["volumeMounts"]}


def test_evidence_is_writable_by_gateway_read_only_in_workers(
    docs: list[Doc], pod: Doc, config: GatewayConfig
) -> None:
    gateway_mount = covering_mount(container(pod, "gateway"), PurePosixPath(config.staging.dir))
    assert gateway_mount["mountPath"] == str(config.staging.dir)
    assert "subPath" not in gateway_mount and "subPathExpr" not in gateway_mount
    # One volume for every replica: the records in PostgreSQL name its files.
    claim = volumes(pod)[gateway_mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert claim == EVIDENCE_PVC
    assert claim_named(docs, claim)["spec"]["accessModes"] == ["ReadWriteMany"]
    for worker in workers(pod):
        for m in worker["volumeMounts"]:
            if m["name"] == gateway_mount["name"]:
                assert m["readOnly"] is True, worker["name"]
    # The chat worker is the one that could read staged media (file_url pins).
    chat = [m for m in container(pod, "worker-chat")["volumeMounts"] if m["name"] == "evidence"]
    assert len(chat) == 1


@pytest.mark.parametrize("name", UPSTREAMS)
def test_model_volume_is_read_only(pod: Doc, config: GatewayConfig, name: str) -> None:
    launch = upstream(config, name).launch
    assert launch is not None and launch.model_dir is not None
    worker = container(pod, f"worker-{name}")
    mount = covering_mount(worker, PurePosixPath(launch.model_dir))
    assert mount["readOnly"] is True
    source = volumes(pod)[mount["name"]]
    assert source["persistentVolumeClaim"] == {"claimName": MODELS_PVC, "readOnly": True}
    for c in pod["containers"]:
        for m in c["volumeMounts"]:
            if m["name"] == mount["name"]:
                assert m["readOnly"] is True
    gateway_names = {m["name"] for m in container(pod, "gateway")["volumeMounts"]}
    assert mount["name"] not in gateway_names


def test_workers_write_only_scratch_of_their_own(pod: Doc) -> None:
    vols = volumes(pod)
    scratch: list[str] = []
    for worker in workers(pod):
        for m in worker["volumeMounts"]:
            if not m.get("readOnly", False):
                assert m["mountPath"] == "/tmp"
                assert "emptyDir" in vols[m["name"]]
                scratch.append(m["name"])
    assert len(scratch) == len(set(scratch)) == len(UPSTREAMS)


def test_config_keys_and_policies_are_mounted(pod: Doc, config: GatewayConfig) -> None:
    gateway = container(pod, "gateway")
    vols = volumes(pod)

    config_mount = mounts(gateway)[str(CONFIG_IN_POD)]
    assert config_mount["readOnly"] is True
    assert vols[config_mount["name"]]["configMap"]["name"] == "mistralrs-gateway-config"

    policies = covering_mount(gateway, in_pod(config.policies_dir))
    assert policies["mountPath"] == str(in_pod(config.policies_dir))
    assert vols[policies["name"]]["configMap"]["name"] == "mistralrs-gateway-policies"

    assert config.listen.tls is not None
    secret_files = [config.listen.tls.certfile, config.listen.tls.keyfile]
    secret_files += [i.jwks_file for i in config.auth.issuers if i.jwks_file is not None]
    for path in secret_files:
        mount = covering_mount(gateway, in_pod(path))
        assert mount["readOnly"] is True
        assert "secret" in vols[mount["name"]], path

    for m in gateway["volumeMounts"]:
        if "configMap" in vols[m["name"]] or "secret" in vols[m["name"]]:
            assert m["readOnly"] is True


def test_secrets_are_not_in_the_manifests(docs: list[Doc], pod: Doc) -> None:
    assert not [d for d in docs if d["kind"] == "Secret"]
    for c in pod["containers"]:
        for env in c.get("env", []):
            assert "value" not in env or not re.search(
                r"KEY|SECRET|TOKEN|PASSWORD", env["name"], re.IGNORECASE
            )


# --- the shared state store (state, a managed PostgreSQL) ---------------------------


def test_the_replicas_share_state_through_postgres(
    config: GatewayConfig, deployment: Doc, pod: Doc
) -> None:
    """Several replicas, so records are shared (spec §17), the DSN only by Secret reference."""
    assert deployment["spec"]["replicas"] >= 2 and config.limits_store.backend == "redis"
    assert config.state.backend == "postgres"
    env = {e["name"]: e for e in container(pod, "gateway")["env"]}
    dsn = env[config.state.dsn_env]
    assert set(dsn) == {"name", "valueFrom"}  # never a value in the manifest
    assert dsn["valueFrom"] == {
        "secretKeyRef": {"name": STATE_SECRET, "key": "dsn", "optional": False}
    }
    # the DSN holds a password: no file of deploy/ names a postgresql:// URL with one
    for path in yaml_files():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"postgres(ql)?://[^\s:@/]+:[^\s@<]+@", text), path


def test_the_evidence_volume_holds_every_tenants_quota(docs: list[Doc], loaded: Loaded) -> None:
    pvc = claim_named(docs, EVIDENCE_PVC)
    quotas = sum(t.policy.evidence.max_bytes for t in loaded.policies.tenants.values())
    assert quotas <= quantity(pvc["spec"]["resources"]["requests"]["storage"])


def test_the_service_has_no_session_affinity(docs: list[Doc]) -> None:
    # Every replica serves every id: affinity would only unbalance the pods.
    service = only(docs, "Service")["spec"]
    assert service.get("sessionAffinity", "None") == "None"
    assert "sessionAffinityConfig" not in service


# --- kustomization and the policies ConfigMap ------------------------------------------


def test_kustomization_builds_the_config_maps(pod: Doc) -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text(encoding="utf-8"))
    assert kustomization["resources"] == ["k8s.yaml", "redis.yaml"]
    (config_map,) = kustomization["configMapGenerator"]  # the policies are not listed here
    assert config_map == {"name": "mistralrs-gateway-config", "files": ["gateway.yaml"]}
    assert kustomization["generators"] == ["policies-generator.yaml"]
    generator = yaml.safe_load((DEPLOY / "policies-generator.yaml").read_text(encoding="utf-8"))
    assert (generator["apiVersion"], generator["kind"]) == ("builtin", "ConfigMapGenerator")
    assert generator["metadata"]["name"] == volumes(pod)["policies"]["configMap"]["name"]
    # A stable name: policy edits are applied in place and reloaded by SIGHUP.
    assert generator["options"]["disableNameSuffixHash"] is True


def test_policies_config_map_is_generated_from_the_directory(loaded: Loaded) -> None:
    """A policy added, renamed or removed without regenerating fails here."""
    committed = (DEPLOY / "policies-generator.yaml").read_text(encoding="utf-8")
    regenerate = (
        "stale: mistralrs-gateway policies-generator deploy/policies "
        "--output deploy/policies-generator.yaml"
    )
    assert committed == policies_generator(DEPLOY / "policies", DEPLOY), regenerate
    listed = yaml.safe_load(committed)["files"]
    on_disk = [p.relative_to(DEPLOY).as_posix() for p in policy_files(DEPLOY / "policies")]
    assert listed == on_disk
    # Every ConfigMap key is a tenant the gateway loads, and every tenant has its key.
    assert {PurePosixPath(f).stem for f in listed} == set(loaded.policies.tenants)


def kustomize_build(folder: Path) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_kustomize_builds_the_policies_config_map_from_every_file(loaded: Loaded) -> None:
    """Where kubectl is at hand: what kustomize really makes of the generator config."""
    built = kustomize_build(DEPLOY)
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in built}
    policies = by_name[("ConfigMap", "mistralrs-gateway-policies")]
    expected = {p.name: p.read_text(encoding="utf-8") for p in policy_files(DEPLOY / "policies")}
    assert policies["data"] == expected
    assert {PurePosixPath(k).stem for k in policies["data"]} == set(loaded.policies.tenants)
    kinds = sorted(kind for kind, _ in by_name)
    assert kinds.count("Deployment") == 2 and "PodDisruptionBudget" in kinds
    observability = kustomize_build(DEPLOY / "observability")
    assert {d["kind"] for d in observability} == {"ConfigMap", "PodMonitor", "PrometheusRule"}
    (dashboard,) = [d for d in observability if d["kind"] == "ConfigMap"]
    source = (DEPLOY / "observability" / "grafana-dashboard.json").read_text(encoding="utf-8")
    assert json.loads(dashboard["data"]["grafana-dashboard.json"]) == json.loads(source)


# --- Service and NetworkPolicy -----------------------------------------------------------


def test_service_exposes_only_8443(docs: list[Doc]) -> None:
    service = only(docs, "Service")["spec"]
    assert service["selector"] == APP
    assert service.get("type", "ClusterIP") == "ClusterIP"
    # Metrics are scraped from the pods (PodMonitor), never offered behind the Service.
    assert [(p["port"], p["targetPort"]) for p in service["ports"]] == [(8443, "https")]


def test_network_policy_admits_callers_to_8443_and_monitoring_to_metrics(
    docs: list[Doc], config: GatewayConfig
) -> None:
    policy = only(docs, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == APP
    assert "Ingress" in policy["policyTypes"]
    assert all(rule.get("ports") for rule in policy["ingress"])  # no all-ports rule
    assert config.metrics.listen is not None
    callers, monitoring = policy["ingress"]
    assert callers["ports"] == [{"port": config.listen.port, "protocol": "TCP"}]
    assert monitoring["ports"] == [{"port": config.metrics.listen.port, "protocol": "TCP"}]
    # The metrics port is open to one namespace only: a `from` naming it, nothing wider.
    (source,) = monitoring["from"]
    assert set(source) <= {"namespaceSelector", "podSelector"}
    assert source["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
    }
    ports = [p["port"] for rule in policy["ingress"] for p in rule["ports"]]
    assert sorted(ports) == sorted([config.listen.port, config.metrics.listen.port])
    assert "Egress" in policy["policyTypes"]


def test_gateway_egress_is_only_redis_postgres_and_dns(
    docs: list[Doc], redis_docs: list[Doc]
) -> None:
    policy = only(docs, "NetworkPolicy")["spec"]
    to_redis, to_postgres, to_dns = policy["egress"]
    redis_pods = only(redis_docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert to_redis["to"] == [{"podSelector": {"matchLabels": redis_pods}}]
    redis_port = only(redis_docs, "Service")["spec"]["ports"][0]["port"]
    assert to_redis["ports"] == [{"port": redis_port, "protocol": "TCP"}]
    # The managed PostgreSQL: one address block (never the whole internet), its port.
    (peer,) = to_postgres["to"]
    assert set(peer) == {"ipBlock"} and set(peer["ipBlock"]) == {"cidr"}
    assert not peer["ipBlock"]["cidr"].endswith("/0")
    assert to_postgres["ports"] == [{"port": 5432, "protocol": "TCP"}]
    (dns,) = to_dns["to"]
    assert dns["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert dns["namespaceSelector"]
    assert {(p["port"], p["protocol"]) for p in to_dns["ports"]} == {(53, "UDP"), (53, "TCP")}


# --- the shared limits store (redis.yaml, limits_store) -------------------------------


def redis_container(redis_docs: list[Doc]) -> Doc:
    spec: Doc = only(redis_docs, "Deployment")["spec"]["template"]["spec"]
    return container(spec, "redis")


def redis_flags(redis_docs: list[Doc]) -> dict[str, str]:
    args = redis_container(redis_docs)["args"]
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2])
    return dict(zip(args[::2], args[1::2], strict=True))


def test_the_gateway_points_at_the_example_redis(
    config: GatewayConfig, pod: Doc, redis_docs: list[Doc]
) -> None:
    store = config.limits_store
    assert store.backend == "redis" and store.on_error == "closed"
    url = urlsplit(store.url)
    service = only(redis_docs, "Service")
    assert (url.hostname, url.port) == (
        service["metadata"]["name"],
        service["spec"]["ports"][0]["port"],
    )
    assert url.password is None and store.password_env is not None
    # the gateway's variable and Redis' own password come from one Secret key
    gateway_env = {e["name"]: e for e in container(pod, "gateway")["env"]}
    redis_env = {e["name"]: e for e in redis_container(redis_docs)["env"]}
    source = gateway_env[store.password_env]["valueFrom"]["secretKeyRef"]
    assert source == redis_env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert source == redis_env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]
    assert store.key_prefix and store.key_prefix != "mrgw:"  # an environment of its own


def test_redis_refuses_writes_rather_than_evicting_limits(redis_docs: list[Doc]) -> None:
    flags = redis_flags(redis_docs)
    # every key has a TTL: an LRU/LFU or volatile-* policy would drop live buckets
    assert flags["--maxmemory-policy"] == "noeviction"
    assert flags["--requirepass"] == "$(REDIS_PASSWORD)"
    assert flags["--appendonly"] == "yes"  # the day's counters survive a restart
    assert "--protected-mode" not in flags
    data = mounts(redis_container(redis_docs))[flags["--dir"]]
    volume = volumes(only(redis_docs, "Deployment")["spec"]["template"]["spec"])[data["name"]]
    assert "persistentVolumeClaim" in volume


def test_redis_pod_is_locked_down(redis_docs: list[Doc]) -> None:
    deployment = only(redis_docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1  # one writer: one set of limits
    spec = deployment["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    ctx = redis_container(redis_docs)["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["allowPrivilegeEscalation"] is False
    assert ctx["readOnlyRootFilesystem"] is True and ctx["capabilities"]["drop"] == ["ALL"]
    assert re.search(r"@sha256:[0-9a-f]{64}$", redis_container(redis_docs)["image"])
    for env in redis_container(redis_docs)["env"]:
        assert "value" not in env  # secrets only by reference
    assert not [d for d in redis_docs if d["kind"] == "Secret"]
    policy = only(redis_docs, "NetworkPolicy")["spec"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": APP}}]
    assert rule["ports"] == [{"port": 6379, "protocol": "TCP"}]
    assert policy["egress"] == [] and "Egress" in policy["policyTypes"]
    assert only(redis_docs, "Service")["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_redis_runs_with_the_manifests_flags_and_the_store_works_on_it(
    tmp_path: Path, redis_docs: list[Doc], config: GatewayConfig
) -> None:
    """redis-server 7 accepts the manifest's arguments, and the store decides on it."""
    flags = redis_flags(redis_docs)
    password = "deploy-test-password"
    port = free_port()
    flags.update(
        {
            "--requirepass": password,
            "--dir": str(tmp_path),
            "--port": str(port),
            "--bind": "127.0.0.1",  # loopback only in tests
            "--logfile": str(tmp_path / "redis.log"),
        }
    )
    argv = [REDIS_SERVER, *[x for pair in flags.items() for x in pair]]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        client = Redis(host="127.0.0.1", port=port, password=password, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except (OSError, RedisError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.01)
        policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
        assert policy == "noeviction"
        assert client.config_get("appendonly")["appendonly"] == "yes"
        client.close()

        async def decide() -> str:
            store = RedisLimitsStore.from_url(
                f"redis://127.0.0.1:{port}/0",
                password=password,
                timeout_s=2,
                key_prefix=config.limits_store.key_prefix,
            )
            await store.start()
            hold = await store.reserve("acme", TenantLimits(requests_per_minute=600), 0)
            await store.aclose(2)
            return hold.headers()["x-ratelimit-remaining-requests"]

        assert asyncio.run(decide()) == "599"
    finally:
        proc.terminate()  # by its PID
        proc.wait(10)


# --- Dockerfile --------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        instruction, _, rest = line.partition(" ")
        out.append((instruction.upper(), rest.strip()))
    assert not pending
    return out


def instructions(name: str) -> list[str]:
    return [rest for instruction, rest in dockerfile() if instruction == name]


def test_dockerfile_base_is_slim_python_3_11() -> None:
    froms = instructions("FROM")
    assert froms
    for line in froms:
        image = line.split()[0]
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", image)
    assert "latest" not in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_dockerfile_runs_as_numeric_non_root() -> None:
    user = instructions("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0
    assert not gid or (gid.isdigit() and int(gid) > 0)
    # The last stage (the image) sets the user after all RUN steps.
    last = dockerfile()
    last_user = max(i for i, (name, _) in enumerate(last) if name == "USER")
    last_run = max(i for i, (name, _) in enumerate(last) if name == "RUN")
    assert last_user > last_run


def test_dockerfile_entrypoint_cmd_healthcheck_volume() -> None:
    assert [json.loads(e) for e in instructions("ENTRYPOINT")] == [["mistralrs-gateway", "serve"]]
    assert [json.loads(c) for c in instructions("CMD")] == [["--config", str(CONFIG_IN_POD)]]
    (health,) = instructions("HEALTHCHECK")
    assert "/livez" in health
    assert "python" in health
    assert "curl" not in health and "wget" not in health
    volume = [json.loads(v) for v in instructions("VOLUME")]
    assert volume == [["/var/lib/mistralrs-gateway"]]


def test_dockerfile_installs_without_dev_deps() -> None:
    installs = [r for r in instructions("RUN") if "pip install" in r]
    assert installs
    for line in installs:
        assert "[test]" not in line and " -e " not in line
        assert re.search(r"pip install \.( |$)", line)


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction, rest in dockerfile():
        if instruction == "FROM":
            stages.append([])
        stages[-1].append((instruction, rest))
    return stages


def test_dockerfile_compiles_the_hot_core_in_the_build_stage_only() -> None:
    build, image = _stages()
    build_runs = " ".join(rest for name, rest in build if name == "RUN")
    # gcc in the build stage, the compiled build checked to be the one loaded,
    # mypy (the compiler) not left in the venv the image copies
    assert "apt-get install" in build_runs and " gcc " in build_runs
    assert "-m gateway.tools.build_native &&" in build_runs.replace("  ", " ")
    assert '--which)" = "mypyc built"' in build_runs
    assert "pip uninstall -y mypy" in build_runs
    image_runs = " ".join(rest for name, rest in image if name == "RUN")
    assert "gcc" not in image_runs and "apt-get" not in image_runs
    assert [rest for name, rest in image if name == "COPY"] == ["--from=build /opt/venv /opt/venv"]


def test_dockerfile_bakes_in_no_secrets() -> None:
    for name in ("ENV", "ARG", "LABEL"):
        for line in instructions(name):
            keys = re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", line) or line.split()[:1]
            for key in keys:
                assert not re.search(r"KEY|SECRET|TOKEN|PASSWORD", key, re.IGNORECASE), key
    for line in instructions("COPY") + instructions("ADD"):
        assert not re.search(r"\.(pem|key|crt|env)\b|jwks", line), line
    assert not instructions("ADD")  # no remote fetches into the image


def test_dockerignore_keeps_secrets_and_dev_files_out() -> None:
    entries = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", "tests", "fixtures", "var", "**/*.pem", "**/*.key"} <= entries
    assert {"gateway", "pyproject.toml", "README.md"}.isdisjoint(entries)
