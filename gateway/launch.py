"""Launch contract: ``upstream.launch`` → ``mistralrs serve`` argv + serve identity.

Pure: takes a :class:`~gateway.config.LaunchConfig`, returns values; starts no
process and reads no file (spec §11, §12 "Launch contract").

Theory of operation
-------------------
The *serve identity* is the SHA-256 of the launch object's canonical JSON
(``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=True)``
over ``model_dump(mode="json")``, defaults included). It is derived from the
contract alone, never from the argv, so it is defined for every valid config
and receipts can always carry it; two configs that spell the same contract
differently (defaults omitted, keys reordered) share one identity.

The argv is a list, never a shell string. It always binds ``127.0.0.1``,
passes ``--no-ui``, and is checked against a denylist before it is returned,
so a later edit here cannot quietly turn on agent tools, search, code or
shell execution, MCP, LoRA, tool dispatch or request logging.

Flags per pinned version (reference §9/§10; an assumption where marked):

============================  ================================================
version                       argv
============================  ================================================
< 0.8.2                       refused: no documented ``serve`` contract
0.8.2 ≤ v < 0.9.0             ``serve --host 127.0.0.1 --port P --no-ui``
                              + model/runtime flags (below)
≥ 0.9.0                       as above + ``--access-log-format json``
============================  ================================================

Model/runtime flags, emitted for every accepted version: ``-m <model_dir>``,
``--format``, ``--max-seqs``, ``--max-seq-len``, ``--max-batch-size``,
``--paged-attn``, ``--prefix-cache-n``, ``--max-num-images``, ``--max-edge``,
and ``--cpu`` for ``device: cpu``. Assumption: reference §10 lists v0.8.2's
*server* group as only ``--port --host --no-ui --max-tool-rounds
--tool-dispatch-url``; it lists no difference in the model, runtime, device,
paged-attention or multimodal groups, so those are taken to exist from 0.8.2
on. Checking ``mistralrs serve --help`` of the pinned binary is part of a
release (docs/deploy.md). The top-level (auto) model options are used, not a
``text``/``multimodal`` subcommand, because only auto and multimodal accept
``--max-num-images``/``--max-edge``.

Devices: ``cpu`` → ``--cpu`` (forces CPU even on an accelerated build);
``cuda`` and ``metal`` → no flag. mistral.rs picks its accelerator from the
features it was compiled with, so the device is really chosen by the pinned
binary (``binary_sha256``); ``device`` records the intent in the identity.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gateway.config import GatewayConfig, LaunchConfig

BINARY = "mistralrs"
LOOPBACK = "127.0.0.1"
#: oldest release whose ``serve`` flags the reference documents
OLDEST_KNOWN_VERSION = (0, 8, 2)
#: spec §12: older ``serve`` lacks ``--access-log-format``
JSON_ACCESS_LOG_SINCE = (0, 9, 0)


# Exact names, checked on the part before any "=".
_FORBIDDEN_FLAGS = frozenset(
    {
        "-l",
        "--log",
        "--ui",
        "--agent",
        "--agent-permission",
        "--enable-search",
        "--enable-code-execution",
        "--enable-shell",
        "--max-tool-rounds",
        "--tool-dispatch-url",
        "--mcp-port",
        "--mcp-config",
        "--enable-lora",
        "--lora",
    }
)
# Families, so a flag added upstream later (``--sandbox-*``, ``--code-exec-*``…) is caught too.
_FORBIDDEN_PREFIXES = (
    "--agent",
    "--enable-",
    "--sandbox",
    "--search",
    "--code-exec",
    "--shell",
    "--skills",
    "--mcp",
    "--lora",
    "--tool-",
)
#: the only short flag this module emits; any other short flag (``-l``…) is refused
_SHORT_FLAGS = frozenset({"-m"})


class UnsafeLaunchError(ValueError):
    """An argv that breaks the launch invariants; raised instead of returning it."""


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    serve_identity: str
    launch: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        # Copies: a caller that edits the output must not change the plan.
        return {
            "argv": list(self.argv),
            "serve_identity": self.serve_identity,
            "launch": dict(self.launch),
        }


def launch_dict(launch: LaunchConfig) -> dict[str, Any]:
    return launch.model_dump(mode="json")


def serve_identity(launch: LaunchConfig) -> str:
    canonical = json.dumps(
        launch_dict(launch), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def build_argv(launch: LaunchConfig) -> list[str]:
    # Numeric: 0.10.0 > 0.9.2 (the config only admits MAJOR.MINOR.PATCH).
    version = launch.version_tuple()
    if version < OLDEST_KNOWN_VERSION:
        oldest = ".".join(str(p) for p in OLDEST_KNOWN_VERSION)
        raise ValueError(
            f"upstream.launch.version {launch.version} is older than {oldest}, "
            "the oldest release with a known `mistralrs serve` contract"
        )
    argv = [BINARY, "serve", "--host", LOOPBACK, "--port", str(launch.port), "--no-ui"]
    if version >= JSON_ACCESS_LOG_SINCE:
        argv += ["--access-log-format", "json"]
    argv += [
        "-m",
        launch.model_dir,
        "--format",
        launch.format,
        "--max-seqs",
        str(launch.max_seqs),
        "--max-seq-len",
        str(launch.max_seq_len),
        "--max-batch-size",
        str(launch.max_batch_size),
        "--paged-attn",
        launch.paged_attn,
        "--prefix-cache-n",
        str(launch.prefix_cache_n),
        "--max-num-images",
        str(launch.max_num_images),
        "--max-edge",
        str(launch.max_edge),
    ]
    if launch.device == "cpu":
        argv.append("--cpu")
    check_argv(argv)
    return argv


def check_argv(argv: list[str]) -> None:
    """Defence in depth: raise UnsafeLaunchError unless argv keeps the launch invariants."""
    if argv[:2] != [BINARY, "serve"]:
        raise UnsafeLaunchError(f"argv must start with {BINARY!r} 'serve'")
    for token in argv[2:]:
        if not token.startswith("-"):
            continue
        name = token.split("=", 1)[0]
        if not token.startswith("--") and name not in _SHORT_FLAGS:
            raise UnsafeLaunchError(f"short flag not allowed in the worker argv: {name}")
        if name in _FORBIDDEN_FLAGS or name.startswith(_FORBIDDEN_PREFIXES):
            raise UnsafeLaunchError(f"forbidden flag in the worker argv: {name}")
    hosts = [i for i, token in enumerate(argv) if token.split("=", 1)[0] == "--host"]
    if len(hosts) != 1 or argv[hosts[0] : hosts[0] + 2] != ["--host", LOOPBACK]:
        raise UnsafeLaunchError(f"the worker must bind exactly --host {LOOPBACK}")
    if "--no-ui" not in argv:
        raise UnsafeLaunchError("the worker argv must pass --no-ui")


def build_plan(launch: LaunchConfig) -> LaunchPlan:
    return LaunchPlan(
        argv=build_argv(launch),
        serve_identity=serve_identity(launch),
        launch=launch_dict(launch),
    )


def launch_plan_json(config: GatewayConfig) -> dict[str, Any]:
    """What ``mistralrs-gateway launch-plan`` prints."""
    launch = config.upstream.launch
    if launch is None:
        raise ValueError("upstream.launch is not configured")
    return build_plan(launch).to_json()
