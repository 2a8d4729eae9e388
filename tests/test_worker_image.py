"""deploy/worker/Dockerfile, deploy/model-fill.yaml and docs/worker-image.md agree
with the launch contract: the image builds the pinned release, the Job publishes
only verified bundles, and the guide's commands run as written.

No Docker daemon is needed: the Dockerfile is read as instructions, and the
Job's script is run with ``sh`` on a temporary "volume".
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import GatewayConfig, LaunchConfig
from gateway.config.loader import load_config
from gateway.upstream.bundle import DEFINITION, bundle_digest
from gateway.upstream.launch import BINARY
from tests.support.docblocks import REPO, Block, reader_env, run, shell_blocks

DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "worker" / "Dockerfile"
FILL = DEPLOY / "model-fill.yaml"
GUIDE = REPO / "docs" / "worker-image.md"

Doc = dict[str, Any]


# --- the Dockerfile, read as instructions ---------------------------------------


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        instruction, _, rest = line.partition(" ")
        out.append((instruction.upper(), rest.strip()))
    assert not pending
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions per stage name; the unnamed last stage is ``""``."""
    found: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for instruction, rest in instructions():
        if instruction == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else ""
            current = found.setdefault(name, [])
        if current is not None:
            current.append((instruction, rest))
    return found


def global_args() -> dict[str, str]:
    """The ARG defaults declared before the first FROM."""
    args: dict[str, str] = {}
    for instruction, rest in instructions():
        if instruction == "FROM":
            break
        if instruction == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            args[name] = value.strip('"')
    return args


def launches(config: GatewayConfig) -> list[LaunchConfig]:
    return [u.launch for u in config.workers if u.launch is not None]


@pytest.fixture(scope="module")
def config() -> GatewayConfig:
    return load_config(DEPLOY / "gateway.yaml")


def deployment_pod() -> Doc:
    """The pod template of deploy/k8s.yaml (read, never edited here)."""
    docs = [d for d in yaml.safe_load_all((DEPLOY / "k8s.yaml").read_text()) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    return dict(deployment["spec"]["template"]["spec"])


@pytest.fixture(scope="module")
def workers() -> list[Doc]:
    """The pod's worker containers: those that run the mistral.rs binary."""
    found = [dict(c) for c in deployment_pod()["containers"] if c["command"][:1] == [BINARY]]
    assert found, "deploy/k8s.yaml runs no worker"
    return found


def test_the_image_pins_the_release_every_launch_names(config: GatewayConfig) -> None:
    args = global_args()
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", args["MISTRALRS_VERSION"])
    assert re.fullmatch(r"[0-9a-f]{40}", args["MISTRALRS_REV"])
    assert launches(config), "deploy/gateway.yaml pins no worker"
    for launch in launches(config):
        assert launch.version == args["MISTRALRS_VERSION"]


def test_cargo_installs_the_locked_release_of_mistralrs_cli() -> None:
    (install,) = [r for i, r in instructions() if i == "RUN" and "cargo install" in r]
    words = install.split()
    for flag in ("--locked", "--no-default-features"):
        assert flag in words, flag
    assert '--version "=${MISTRALRS_VERSION}"' in install
    assert '--git "${MISTRALRS_GIT}" --rev "${MISTRALRS_REV}"' in install
    assert "mistralrs-cli" in words
    assert "--path" not in words and "latest" not in install
    # The installed binary is the one whose version and digest are checked.
    assert '"$(/opt/mistralrs/bin/mistralrs --version)" = "mistralrs ${MISTRALRS_VERSION}"' in (
        install
    )
    assert "sha256sum" in install and "/out/mistralrs.sha256" in install


def test_the_toolchain_meets_the_release_rust_version() -> None:
    # The 0.9.2 workspace declares rust-version = "1.94".
    match = re.fullmatch(r"rust:1\.(\d+)(\.\d+)?-slim-[a-z]+", global_args()["RUST_IMAGE"])
    assert match and int(match.group(1)) >= 94


def test_cpu_and_cuda_variants_by_build_arg() -> None:
    found = stages()
    assert global_args()["VARIANT"] == "cpu"
    assert {"build-cpu", "build-cuda", "build", "runtime-cpu", "runtime-cuda", "digest"} <= set(
        found
    )
    assert found["build"][0] == ("FROM", "build-${VARIANT} AS build")
    assert found[""][0] == ("FROM", "runtime-${VARIANT}")
    cuda_env = " ".join(r for i, r in found["build-cuda"] if i in ("ENV", "ARG"))
    assert "CUDA_COMPUTE_CAP" in cuda_env and 'CUDA_FEATURES="cuda' in cuda_env
    assert 'MISTRALRS_FEATURES=""' in " ".join(r for i, r in found["build-cpu"] if i == "ENV")


def test_the_image_runs_the_binary_as_a_numeric_non_root_user(workers: list[Doc]) -> None:
    final = stages()[""]
    users = [r for i, r in final if i == "USER"]
    assert users, "the image sets its user"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    names = [i for i, _ in final]
    assert len(names) - 1 - names[::-1].index("USER") > max(
        n for n, name in enumerate(names) if name == "RUN"
    )
    # Each worker sets its own numeric uid, so nothing depends on the image's
    # passwd; the image's own is one of them.
    uids = set()
    for worker in workers:
        context = worker["securityContext"]
        assert context["runAsNonRoot"] is True
        assert isinstance(context["runAsUser"], int) and context["runAsUser"] > 0
        assert isinstance(context["runAsGroup"], int) and context["runAsGroup"] > 0
        uids.add(context["runAsUser"])
    assert int(uid) in uids


def test_each_worker_image_is_a_variant_of_this_build(
    workers: list[Doc], config: GatewayConfig
) -> None:
    version = global_args()["MISTRALRS_VERSION"]
    devices = {launch.device for launch in launches(config)}
    variants = set()
    for worker in workers:
        match = re.fullmatch(
            rf"\S+/mistralrs:{re.escape(version)}-(cpu|cuda)@sha256:[0-9a-f]{{64}}", worker["image"]
        )
        assert match, worker["image"]
        variants.add(match.group(1))
    # The CUDA build serves `device: cuda`, the CPU build `device: cpu`.
    assert variants == devices - {"metal"}


def test_the_image_needs_no_shell_at_run_time(workers: list[Doc]) -> None:
    final = stages()[""]
    assert [json.loads(r) for i, r in final if i == "ENTRYPOINT"] == [[BINARY]]
    assert all(worker["command"] == [BINARY] for worker in workers)
    assert not [r for i, r in final if i == "CMD"]
    for instruction, rest in final:
        if instruction == "RUN":
            json.loads(rest)  # exec form: the image's own steps need no shell either
    copies = [r for i, r in final if i == "COPY"]
    assert f"--from=build /opt/mistralrs/bin/{BINARY} /usr/local/bin/{BINARY}" in copies
    runs = [json.loads(r) for i, r in final if i == "RUN"]
    assert ["sha256sum", "--check", "--strict", "/usr/local/share/mistralrs/mistralrs.sha256"] in (
        runs
    )
    assert [BINARY, "--version"] in runs
    env = " ".join(r for i, r in final if i == "ENV")
    assert "HF_HUB_OFFLINE=1" in env
    assert not [r for i, r in final if i == "EXPOSE"]


def test_the_digest_can_be_exported_without_running_the_image() -> None:
    assert stages()["digest"] == [
        ("FROM", "scratch AS digest"),
        ("COPY", "--from=build /out/mistralrs.sha256 /"),
    ]


def test_the_dockerfile_fetches_nothing_into_the_image() -> None:
    names = [i for i, _ in instructions()]
    assert "ADD" not in names
    for instruction, rest in instructions():
        if instruction in ("ENV", "ARG", "LABEL"):
            for key in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", rest) or rest.split()[:1]:
                assert not re.search(r"KEY|SECRET|TOKEN|PASSWORD", key, re.IGNORECASE), key
        if instruction == "RUN":
            assert "curl" not in rest and "wget" not in rest and "rustup" not in rest


# --- deploy/model-fill.yaml ------------------------------------------------------


@pytest.fixture(scope="module")
def fill_docs() -> list[Doc]:
    return [d for d in yaml.safe_load_all(FILL.read_text(encoding="utf-8")) if d]


def job(docs: list[Doc]) -> Doc:
    (found,) = [d for d in docs if d["kind"] == "Job"]
    return found


def fill_container(docs: list[Doc]) -> Doc:
    (container,) = job(docs)["spec"]["template"]["spec"]["containers"]
    return dict(container)


def script(docs: list[Doc]) -> str:
    container = fill_container(docs)
    assert container["command"] == ["/bin/sh", "-c"]
    (text,) = container["args"]
    return str(text)


def claim_mounts(pod: Doc, claim: str) -> tuple[list[Doc], list[Doc]]:
    """(volumes, mounts) of a pod spec that use the PVC ``claim``."""
    volumes = [
        v
        for v in pod.get("volumes", [])
        if v.get("persistentVolumeClaim", {}).get("claimName") == claim
    ]
    names = {v["name"] for v in volumes}
    mounts = [
        m
        for c in [*pod.get("initContainers", []), *pod.get("containers", [])]
        for m in c.get("volumeMounts", [])
        if m["name"] in names
    ]
    return volumes, mounts


def pod_specs(doc: Doc) -> list[Doc]:
    spec = doc.get("spec", {})
    if doc.get("kind") == "Pod":
        return [spec]
    if doc.get("kind") == "CronJob":
        return [spec["jobTemplate"]["spec"]["template"]["spec"]]
    template = spec.get("template", {})
    return [template["spec"]] if "spec" in template else []


def test_the_job_is_the_only_writer_of_the_model_volume(fill_docs: list[Doc]) -> None:
    pod = job(fill_docs)["spec"]["template"]["spec"]
    volumes, mounts = claim_mounts(pod, "mosaic-models")
    assert len(volumes) == 1 and len(mounts) == 1
    assert volumes[0]["persistentVolumeClaim"].get("readOnly", False) is False
    assert mounts[0].get("readOnly", False) is False
    review_volumes, review_mounts = claim_mounts(pod, "mosaic-models-review")
    assert review_volumes[0]["persistentVolumeClaim"]["readOnly"] is True
    assert [m["readOnly"] for m in review_mounts] == [True]
    others = 0
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        if path == FILL:
            continue
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            for spec in pod_specs(doc or {}):
                volumes, mounts = claim_mounts(spec, "mosaic-models")
                for volume in volumes:
                    others += 1
                    assert volume["persistentVolumeClaim"].get("readOnly") is True, path
                assert all(m.get("readOnly") is True for m in mounts), path
    assert others >= 1, "the workers mount the model volume somewhere in deploy/"


def test_the_job_writes_where_the_workers_read(fill_docs: list[Doc]) -> None:
    (mount,) = claim_mounts(job(fill_docs)["spec"]["template"]["spec"], "mosaic-models")[1]
    worker_mounts = claim_mounts(deployment_pod(), "mosaic-models")[1]
    assert worker_mounts
    assert {m["mountPath"] for m in worker_mounts} == {mount["mountPath"]}
    env = {e["name"]: e["value"] for e in fill_container(fill_docs)["env"]}
    assert env["MODELS_ROOT"] == mount["mountPath"]
    assert env["BUNDLE_SOURCE"].startswith("/review/")


def test_the_job_publishes_a_bundle_a_launch_pins(
    fill_docs: list[Doc], config: GatewayConfig
) -> None:
    env = {e["name"]: e["value"] for e in fill_container(fill_docs)["env"]}
    pinned: set[str] = set()
    for launch in launches(config):
        if launch.model_bundle_sha256 is not None:
            pinned.add(launch.model_bundle_sha256)
        pinned.update(m.model_bundle_sha256 for m in launch.models or [])
    assert env["MODEL_BUNDLE_SHA256"] in pinned


def test_the_script_verifies_before_it_renames(fill_docs: list[Doc]) -> None:
    text = script(fill_docs)
    source = text.index('bundle-digest "$BUNDLE_SOURCE"')
    copy = text.index('cp -R "$BUNDLE_SOURCE/." "$stage/"')
    staged = text.index('bundle-digest "$stage"')
    rename = text.index('mv -T "$stage" "$final"')
    assert source < copy < staged < rename
    assert text.index('bundle-digest "$final"') < source  # a published one is checked, not replaced
    assert text.startswith("set -eu\n")


def test_the_job_runs_locked_down(fill_docs: list[Doc]) -> None:
    spec = job(fill_docs)["spec"]
    pod = spec["template"]["spec"]
    assert spec["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    # Its own uid: not root, and none that a container of the serving pod runs as.
    taken = {
        c["securityContext"]["runAsUser"]
        for c in deployment_pod()["containers"]
        if "runAsUser" in c.get("securityContext", {})
    }
    assert pod["securityContext"]["runAsUser"] not in {0, *taken}
    container = fill_container(fill_docs)
    ctx = container["securityContext"]
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert re.fullmatch(r"\S+/mistralrs-gateway:[\w.-]+@sha256:[0-9a-f]{64}", container["image"])
    (policy,) = [d for d in fill_docs if d["kind"] == "NetworkPolicy"]
    labels = job(fill_docs)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]


# --- the Job's script, on a temporary volume ---------------------------------------


def fill(docs: list[Doc], root: Path, source: Path, want: str) -> subprocess.CompletedProcess[str]:
    env = reader_env() | {
        "MODEL_BUNDLE_SHA256": want,
        "BUNDLE_SOURCE": str(source),
        "MODELS_ROOT": str(root),
        "HOSTNAME": "mosaic-model-fill-x1",
    }
    return subprocess.run(
        ["sh", "-c", script(docs)], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def make_bundle(path: Path) -> str:
    (path / "sub").mkdir(parents=True)
    (path / "config.json").write_text('{"architectures": ["X"]}\n')
    (path / ".hidden").write_bytes(b"covered too")
    (path / "sub" / "model.safetensors").write_bytes(os.urandom(4096))
    return bundle_digest(path).sha256


def test_the_script_publishes_a_verified_read_only_copy(
    tmp_path: Path, fill_docs: list[Doc]
) -> None:
    source, root = tmp_path / "review" / "model", tmp_path / "models"
    root.mkdir()
    want = make_bundle(source)
    done = fill(fill_docs, root, source, want)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"published: {root / want}"
    assert sorted(p.name for p in root.iterdir()) == [want]  # no copy left behind
    assert bundle_digest(root / want).sha256 == want
    for path in [root / want, *(root / want).rglob("*")]:
        mode = path.stat().st_mode
        assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), path
        assert mode & stat.S_IROTH, path
    again = fill(fill_docs, root, source, want)
    assert again.returncode == 0 and again.stdout.strip() == f"already published: {root / want}"


def test_the_script_refuses_bytes_that_are_not_the_reviewed_ones(
    tmp_path: Path, fill_docs: list[Doc]
) -> None:
    source, root = tmp_path / "review" / "model", tmp_path / "models"
    root.mkdir()
    want = make_bundle(source)
    (source / "config.json").write_text('{"architectures": ["Y"]}\n')
    done = fill(fill_docs, root, source, want)
    assert done.returncode == 1 and "refused" in done.stderr and want in done.stderr
    assert list(root.iterdir()) == []


def test_the_script_never_replaces_a_published_bundle(tmp_path: Path, fill_docs: list[Doc]) -> None:
    source, root = tmp_path / "review" / "model", tmp_path / "models"
    want = make_bundle(source)
    (root / want).mkdir(parents=True)
    (root / want / "config.json").write_text("tampered\n")
    done = fill(fill_docs, root, source, want)
    assert done.returncode == 1 and "exists with digest" in done.stderr
    assert (root / want / "config.json").read_text() == "tampered\n"
    assert sorted(p.name for p in root.iterdir()) == [want]


def test_the_script_refuses_symlinks_and_cleans_a_stale_copy(
    tmp_path: Path, fill_docs: list[Doc]
) -> None:
    source, root = tmp_path / "review" / "model", tmp_path / "models"
    want = make_bundle(source)
    stale = root / f".incoming-{want}-mosaic-model-fill-x1"
    stale.mkdir(parents=True)
    (stale / "partial").write_bytes(b"half")
    stale.chmod(0o555)
    done = fill(fill_docs, root, source, want)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in root.iterdir()) == [want]
    (source / "link").symlink_to(source / "config.json")
    done = fill(fill_docs, tmp_path / "other", source, want)
    assert done.returncode != 0 and "symlink" in done.stderr


def test_the_script_refuses_a_malformed_digest(tmp_path: Path, fill_docs: list[Doc]) -> None:
    source, root = tmp_path / "review" / "model", tmp_path / "models"
    root.mkdir()
    want = make_bundle(source)
    for bad in (want.upper(), want[:-1], f"../{want[3:]}"):
        done = fill(fill_docs, root, source, bad)
        assert done.returncode == 1 and "MODEL_BUNDLE_SHA256" in done.stderr, bad
    assert list(root.iterdir()) == []


# --- docs/worker-image.md --------------------------------------------------------

SHELL = shell_blocks(GUIDE)


@pytest.mark.parametrize("block", SHELL, ids=[b.name for b in SHELL])
def test_the_guide_runs_as_written(block: Block) -> None:
    done = run(block)
    assert done.returncode == 0, f"{block.page}:{block.line}\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), "every command shows its result"


def test_the_guide_states_the_digest_definition_exactly() -> None:
    assert len(SHELL) >= 4
    text = GUIDE.read_text(encoding="utf-8")
    assert DEFINITION in text
    args = global_args()
    assert args["MISTRALRS_REV"] in text and f"v{args['MISTRALRS_VERSION']}" in text
    for name in ("mistralrs-cli", "`mistralrs`", "--locked", "quantized_file", "from-config"):
        assert name in text, name


def test_the_guides_are_linked() -> None:
    for page in ("README.md", "docs/deploy.md"):
        text = (REPO / page).read_text(encoding="utf-8")
        assert "docs/worker-image.md" in text or "worker-image.md" in text, page
        assert "identity.md" in text, page
