"""Launch contract: ``upstream.launch`` → ``mistralrs serve`` argv + serve identity.

Pure: takes a :class:`~gateway.config.LaunchConfig`, returns values; starts no
process and reads no file (spec §11, §12 "Launch contract").

Theory of operation
-------------------
The *serve identity* is the SHA-256 of the launch object's canonical JSON
(``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=True)``
over ``model_dump(mode="json", exclude_none=True)``: defaults included, unset
optional fields left out, so a one-model launch keeps the identity it had
before ``quantized_file``, ``models`` and ``config_path`` existed). It is
derived from the contract alone, never from the argv, so it is defined for
every valid config and receipts can always carry it; two configs that spell
the same contract differently (defaults omitted, keys reordered) share one
identity.

The argv is a list, never a shell string. It always binds ``127.0.0.1``,
passes ``--no-ui``, and is checked against a denylist before it is returned,
so a later edit here cannot quietly turn on agent tools, search, code or
shell execution, MCP, LoRA, tool dispatch or request logging.

Agents (spec §22, §24) come only from the route's ``agents`` section, as the
argv's last flags (:func:`agent_flags`): without it the plan is exactly the
one above (no agentic flag, no ``--agent-permission``); with it always
``--agent-permission ask``, then ``--enable-code-execution --sandbox on
--sandbox-network none`` for ``python``, ``--mcp-config <path>`` for
``mcp_config``, and ``--max-tool-rounds N``; ``web_search`` needs no flag
(the worker fetches the web on any request that asks). Never ``--mcp-port``,
``--tool-dispatch-url``, ``--enable-shell`` or ``--agent``. The denylist
accepts the agentic tail only when it is exactly what the route declares.
``launch.extra_args`` (one-model launches) follow the contract's flags and
pass the same denylist; the config refuses agentic ones there
(``agents_flag_forbidden``). A route with agents has them in its identity
(``"agents"`` beside the launch object); one without keeps the identity it
had.

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

Route kinds (spec §23): a route of kind ``speech`` or ``image`` is served by
``mistralrs serve speech …`` / ``mistralrs serve diffusion …``. The server and
runtime flags (``--host``, ``--port``, ``--no-ui``, ``--access-log-format``,
``--max-seqs``, ``--prefix-cache-n``) come before the subcommand, where clap
reads them as ``serve``'s; after it only what those model types take:
``-m``, ``--max-seq-len``, ``--max-batch-size`` and ``--cpu`` (their options are
the model source and the device; no format, paged attention or multimodal
flags). The kind is part of the identity (``"kind"`` beside the launch object)
for these two only, so every chat and embeddings launch keeps the identity it
had before kinds.

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

from gateway.config import GatewayConfig, LaunchConfig, RouteAgents, RouteKind, UpstreamConfig

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
#: the only short flags this module emits; any other short flag (``-l``…) is refused
_SHORT_FLAGS = frozenset({"-m", "-f"})
_COMMANDS = ("serve", "from-config")
#: the ``serve`` subcommand of a route kind that needs one (spec §23)
SUBCOMMANDS: dict[str, str] = {"speech": "speech", "image": "diffusion"}


class UnsafeLaunchError(ValueError):
    """An argv that breaks the launch invariants; raised instead of returning it."""


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    serve_identity: str
    launch: dict[str, Any]
    #: a multi-model worker's ``from-config`` file, to mount at ``launch.config_path``
    from_config_toml: str | None = None

    def to_json(self) -> dict[str, Any]:
        # Copies: a caller that edits the output must not change the plan.
        out: dict[str, Any] = {
            "argv": list(self.argv),
            "serve_identity": self.serve_identity,
            "launch": dict(self.launch),
        }
        if self.from_config_toml is not None:
            out["from_config_toml"] = self.from_config_toml
        return out


DEFAULT_CONFIG_PATH = "/etc/mistralrs/models.toml"


def launch_dict(
    launch: LaunchConfig, agents: RouteAgents | None = None, kind: RouteKind = "chat"
) -> dict[str, Any]:
    out = launch.model_dump(mode="json", exclude_none=True)
    if agents is not None:
        # What the worker runs is part of what it is: a route with agents has
        # another identity than the same launch without (and none changes
        # for a route without).
        out["agents"] = agents.model_dump(mode="json", exclude_none=True)
    if kind in SUBCOMMANDS:
        # Another program is served: another identity (chat and embeddings keep theirs).
        out["kind"] = kind
    return out


def serve_identity(
    launch: LaunchConfig, agents: RouteAgents | None = None, kind: RouteKind = "chat"
) -> str:
    canonical = json.dumps(
        launch_dict(launch, agents, kind), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def agent_flags(agents: RouteAgents | None) -> list[str]:
    """The argv's agentic tail for a route's ``agents`` (empty without)."""
    if agents is None:
        return []
    flags = ["--agent-permission", "ask"]
    if agents.python:
        flags += ["--enable-code-execution", "--sandbox", "on", "--sandbox-network", "none"]
    if agents.mcp_config is not None:
        flags += ["--mcp-config", agents.mcp_config]
    flags += ["--max-tool-rounds", str(agents.max_tool_rounds)]
    return flags


def launch_kind(upstream: UpstreamConfig) -> RouteKind:
    """The kind a worker's launch serves: its one route's (a multi-model launch
    serves chat and embeddings routes only, which ``from-config`` detects)."""
    if upstream.launch is None or upstream.launch.models is not None:
        return "chat"
    return upstream.route_kinds[upstream.launch.model_dirs[0]]


def _check_version(launch: LaunchConfig) -> tuple[int, int, int]:
    # Numeric: 0.10.0 > 0.9.2 (the config only admits MAJOR.MINOR.PATCH).
    version = launch.version_tuple()
    if version < OLDEST_KNOWN_VERSION:
        oldest = ".".join(str(p) for p in OLDEST_KNOWN_VERSION)
        raise ValueError(
            f"upstream.launch.version {launch.version} is older than {oldest}, "
            "the oldest release with a known `mistralrs serve` contract"
        )
    return version


def build_argv(
    launch: LaunchConfig, agents: RouteAgents | None = None, kind: RouteKind = "chat"
) -> list[str]:
    if launch.models is not None:
        if agents is not None:
            raise UnsafeLaunchError("agents need a one-model launch (`mistralrs serve`)")
        if kind in SUBCOMMANDS:
            raise UnsafeLaunchError("speech and image routes need a one-model launch")
        _check_version(launch)
        argv = [BINARY, "from-config", "-f", launch.config_path or DEFAULT_CONFIG_PATH]
        check_argv(argv)
        return argv
    version = _check_version(launch)
    assert launch.model_dir is not None
    argv = [BINARY, "serve", "--host", LOOPBACK, "--port", str(launch.port), "--no-ui"]
    if version >= JSON_ACCESS_LOG_SINCE:
        argv += ["--access-log-format", "json"]
    subcommand = SUBCOMMANDS.get(kind)
    if subcommand is not None:
        if agents is not None:
            raise UnsafeLaunchError("agents need a chat route, not a speech or image one")
        # extra_args after the model type's flags: where clap reads that model's options.
        argv += _model_type_argv(launch, subcommand) + (launch.extra_args or [])
        check_argv(argv)
        return argv
    argv += ["-m", launch.model_dir, "--format", launch.format]
    if launch.quantized_file is not None:
        # gguf/ggml: -m is the directory, -f the file inside it (findings §9).
        argv += ["-f", launch.quantized_file]
    argv += [
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
    argv += launch.extra_args or []
    argv += agent_flags(agents)
    check_argv(argv, agents)
    return argv


def _model_type_argv(launch: LaunchConfig, subcommand: str) -> list[str]:
    """``serve``'s runtime flags, then ``speech``/``diffusion`` and their model's."""
    assert launch.model_dir is not None
    if launch.format != "plain":
        raise UnsafeLaunchError(f"`serve {subcommand}` takes a plain model")
    argv = [
        "--max-seqs",
        str(launch.max_seqs),
        "--prefix-cache-n",
        str(launch.prefix_cache_n),
        subcommand,
        "-m",
        launch.model_dir,
        "--max-seq-len",
        str(launch.max_seq_len),
        "--max-batch-size",
        str(launch.max_batch_size),
    ]
    if launch.device == "cpu":
        argv.append("--cpu")
    return argv


def from_config_toml(launch: LaunchConfig) -> str:
    """The ``mistralrs from-config`` file of a multi-model worker (its ``ServeConfig``).

    The same invariants as the one-model argv: loopback only, no UI, JSON
    access logs from 0.9.0, no agent, search, tool or MCP keys; each model is
    served under its ``model_dir`` (the TOML ``model_id``, which clients send
    as ``model``)."""
    assert launch.models is not None
    version = _check_version(launch)
    server: dict[str, Any] = {"host": LOOPBACK, "port": launch.port, "no_ui": True}
    if version >= JSON_ACCESS_LOG_SINCE:
        server["access_log_format"] = "json"
    lines = [
        "# mistralrs from-config file generated by `mistralrs-gateway launch-plan`",
        'command = "serve"',
        f"default_model_id = {_toml(launch.models[0].model_dir)}",
        "",
        *_table("server", server),
        *_table("runtime", {"max_seqs": launch.max_seqs, "prefix_cache_n": launch.prefix_cache_n}),
        *_table("paged_attn", {"mode": launch.paged_attn}),
    ]
    for model in launch.models:
        lines += [
            "[[models]]",
            f"model_id = {_toml(model.model_dir)}",
            f"kind = {_toml(model.kind)}",
            "",
        ]
        fmt: dict[str, Any] = {"format": model.format}
        if model.quantized_file is not None:
            fmt["quantized_file"] = model.quantized_file
        lines += _table("models.format", fmt)
        device: dict[str, Any] = {
            "max_seq_len": launch.max_seq_len,
            "max_batch_size": launch.max_batch_size,
        }
        if launch.device == "cpu":
            device["cpu"] = True
        lines += _table("models.device", device)
        lines += _table(
            "models.multimodal",
            {"max_num_images": launch.max_num_images, "max_edge": launch.max_edge},
        )
    text = "\n".join(lines).rstrip("\n") + "\n"
    _check_toml(text)
    return text


def _table(name: str, values: dict[str, Any]) -> list[str]:
    return [f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in values.items()), ""]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in escaped):
        raise UnsafeLaunchError("control characters are not allowed in the worker's config")
    return f'"{escaped}"'


_FORBIDDEN_KEYS = ("mcp", "agent", "search", "tool", "shell", "sandbox", "code_exec", "lora", "log")


def _check_toml(text: str) -> None:
    """Defence in depth, as :func:`check_argv` for an argv."""
    for line in text.splitlines():
        key = line.split("=", 1)[0].strip().strip("[]")
        if any(key.startswith(bad) or f".{bad}" in key for bad in _FORBIDDEN_KEYS):
            raise UnsafeLaunchError(f"forbidden key in the worker's config: {key}")
    if f'host = "{LOOPBACK}"' not in text or "no_ui = true" not in text:
        raise UnsafeLaunchError("the worker must bind 127.0.0.1 with no UI")


def check_argv(argv: list[str], agents: RouteAgents | None = None) -> None:
    """Defence in depth: raise UnsafeLaunchError unless argv keeps the launch invariants.

    With ``agents``, the argv must end with exactly :func:`agent_flags` of
    them; every flag before that tail passes the denylist."""
    tail = agent_flags(agents)
    if tail:
        if argv[-len(tail) :] != tail:
            raise UnsafeLaunchError("the agentic flags must be exactly the route's agents")
        argv = argv[: -len(tail)]
    if argv[:1] != [BINARY] or len(argv) < 2 or argv[1] not in _COMMANDS:
        raise UnsafeLaunchError(f"argv must start with {BINARY!r} 'serve' or 'from-config'")
    if argv[1] == "from-config":
        # Everything else (host, UI, access log) is in the generated file.
        if len(argv) != 4 or argv[2] != "-f":
            raise UnsafeLaunchError("from-config takes only -f <file>")
        return
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


def build_plan(
    launch: LaunchConfig, agents: RouteAgents | None = None, kind: RouteKind = "chat"
) -> LaunchPlan:
    return LaunchPlan(
        argv=build_argv(launch, agents, kind),
        serve_identity=serve_identity(launch, agents, kind),
        launch=launch_dict(launch, agents, kind),
        from_config_toml=from_config_toml(launch) if launch.models is not None else None,
    )


def launch_plan_json(config: GatewayConfig) -> dict[str, Any]:
    """What ``mistralrs-gateway launch-plan`` prints: the one plan of the
    ``upstream:`` shorthand, or ``{"upstreams": {name: plan}}``."""
    if config.upstream is not None:
        launch = config.upstream.launch
        if launch is None:
            raise ValueError("upstream.launch is not configured")
        return build_plan(launch, config.upstream.agents, launch_kind(config.upstream)).to_json()
    plans = {
        u.name: build_plan(u.launch, u.agents, launch_kind(u)).to_json()
        for u in config.workers
        if u.launch is not None
    }
    if not plans:
        raise ValueError("no upstream has a launch section")
    return {"upstreams": plans}
