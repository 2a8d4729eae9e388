"""The tools of an agentic run as the worker reports them (``agentic_loop.rs``,
``chat_completion.rs`` ``serialize_agentic_data``): names, approval metadata,
the ``data`` of the ``calling`` and ``complete`` progress events, and the
files a round produces. Pure; everything "run" is labelled filler.

Per plan entry (agent_plan.py):

========  =====================================  =============  ===========  ===================
entry     tool_name                              tool.kind      source       calling data
========  =====================================  =============  ===========  ===================
web       mistralrs_search_the_web               web_search     built_in     web_search, query
url       mistralrs_website_content_extractor    web_search     built_in     web_search (no key)
python    mistralrs_execute_python               code_execution built_in     code_execution, code
mcp/tool  <name>                                 custom         user         custom, arguments
file      mistralrs_read_file / _list_files      file           built_in     custom, arguments
shell     mistralrs_shell                        shell          built_in     shell, commands
========  =====================================  =============  ===========  ===================

Labels: "Web search", "Web page extraction", "Python code", the tool's name,
"File access", "Shell command". Completed (approved): web search
``results_count`` 3 and ``sources`` (the request's ``allowed_domains``, else
``sim-search-<n>.example``; a query that is a URL: 1 and its host), page
extraction 1 and the URL's host (``www.`` dropped), python ``stdout``,
``working_directory``, ``execution_time_ms``, custom and file ``content``,
shell its fields. Denied, as ``denied_tool_result`` reports it: python
``exception``, shell ``stderr`` + ``status: "denied"``, every other tool a
``custom`` data whose ``content`` is ``{"status":"denied","exception":<message>}``.
Only python, custom and shell rounds produce files (the worker's search and
file tools produce none).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway.testing.simulator.agent_plan import PlanEntry
from gateway.testing.simulator.png import solid_png

#: bodies up to this size are embedded in ``file_produced`` (``WIRE_EMBED_LIMIT_BYTES``)
EMBED_LIMIT = 8 * 1024 * 1024
PREVIEW_CHARS = 4096
_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "text/csv": "csv",
    "text/plain": "txt",
    "text/html": "html",
    "application/json": "json",
    "application/pdf": "pdf",
}
_SIM_DOMAINS = ("sim-search-1.example", "sim-search-2.example", "sim-search-3.example")


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def domain(url: str) -> str:
    host = (urlsplit(url).hostname or "").rstrip(".")
    return host.removeprefix("www.")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """The call one round's model makes (only the first call of a turn runs)."""

    entry: PlanEntry
    round: int
    name: str
    kind: str
    source: str
    label: str
    arguments: str  # the call's arguments, a JSON text

    @property
    def files_ok(self) -> bool:
        return self.entry.kind in ("python", "mcp", "tool", "shell")

    @property
    def metadata(self) -> dict[str, str]:
        return {"source": self.source, "kind": self.kind, "label": self.label}

    def _commands(self) -> list[str]:
        commands: list[str] = orjson.loads(self.arguments)["commands"]
        return commands

    def calling(self) -> dict[str, Any]:
        kind = self.entry.kind
        args = orjson.loads(self.arguments)
        if kind in ("web", "url"):
            data = {"tool_type": "web_search"}
            return {**data, "query": args["query"]} if "query" in args else data
        if kind == "python":
            return {"tool_type": "code_execution", "code": args["code"]}
        if kind == "shell":
            return {"tool_type": "shell", "commands": self._commands()}
        return {"tool_type": "custom", "arguments": self.arguments}

    def result(self, allowed_domains: tuple[str, ...]) -> dict[str, Any]:
        kind, r = self.entry.kind, self.round
        args = orjson.loads(self.arguments)
        if kind == "web":
            query: str = args["query"]
            if query.startswith(("http://", "https://")):
                return {"tool_type": "web_search", "results_count": 1, "sources": [domain(query)]}
            sources = list(allowed_domains[:3] or _SIM_DOMAINS)
            return {"tool_type": "web_search", "results_count": 3, "sources": sources}
        if kind == "url":
            return {"tool_type": "web_search", "results_count": 1, "sources": [domain(args["url"])]}
        if kind == "python":
            data: dict[str, Any] = {"tool_type": "code_execution", "stdout": f"sim-stdout-{r}\n"}
            return {**data, "working_directory": "/sim/work", "execution_time_ms": 5}
        if kind == "shell":
            data = {
                "tool_type": "shell",
                "commands": self._commands(),
                "stdout": f"sim-shell-{r}\n",
            }
            data.update(exit_code=0, status="completed", working_directory="/sim/work")
            return {**data, "timed_out": False}
        content = {"sim": "result", "tool": self.name, "round": r}
        return {"tool_type": "custom", "content": _dumps(content)}

    def denied(self, message: str) -> dict[str, Any]:
        kind = self.entry.kind
        if kind == "python":
            return {"tool_type": "code_execution", "exception": message}
        if kind == "shell":
            data = {"tool_type": "shell", "commands": self._commands(), "stderr": message}
            return {**data, "status": "denied", "timed_out": False}
        return {"tool_type": "custom", "content": denial_content(message)}


def denial_content(message: str) -> str:
    """The tool result a denied call gives the model."""
    return _dumps({"status": "denied", "exception": message})


def tool_call(entry: PlanEntry, round_index: int) -> ToolCall:
    kind, arg, r = entry.kind, entry.arg, round_index
    if kind == "web":
        args: dict[str, Any] = {"query": arg or f"sim query {r}"}
        return ToolCall(
            entry,
            r,
            "mistralrs_search_the_web",
            "web_search",
            "built_in",
            "Web search",
            _dumps(args),
        )
    if kind == "url":
        args = {"url": arg}
        name, label = "mistralrs_website_content_extractor", "Web page extraction"
        return ToolCall(entry, r, name, "web_search", "built_in", label, _dumps(args))
    if kind == "python":
        args = {"code": arg or f'print("sim-python-{r}")'}
        return ToolCall(
            entry,
            r,
            "mistralrs_execute_python",
            "code_execution",
            "built_in",
            "Python code",
            _dumps(args),
        )
    if kind == "file":
        listing = arg == "list"
        name = "mistralrs_list_files" if listing else "mistralrs_read_file"
        args = {} if listing else {"file_id": "file-sim"}
        return ToolCall(entry, r, name, "file", "built_in", "File access", _dumps(args))
    if kind == "shell":
        args = {"commands": [arg or "echo sim"]}
        return ToolCall(
            entry, r, "mistralrs_shell", "shell", "built_in", "Shell command", _dumps(args)
        )
    name = arg or "sim_tool"
    return ToolCall(entry, r, name, "custom", "user", name, _dumps({"sim_round": r}))


# ------------------------------------------------------------------ files


@dataclass(frozen=True, slots=True)
class FileSpec:
    """One produced file: where it comes from and how big it is."""

    run_id: str  # 12 hex
    tool_name: str
    round: int
    index: int
    turn: int
    size: int
    mime: str
    created_at: int
    declared: int | None = None  # the ``bytes`` it claims, when that is a lie (a fault)


def _is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime == "application/json"


def file_bytes(spec: FileSpec) -> bytes:
    """``spec.size`` deterministic bytes: text lines, a real PNG (padded), or filler that
    is not UTF-8 (so the worker would class it binary, as the mime says)."""
    size = spec.size
    if _is_text(spec.mime):
        line = f"sim-file r{spec.round} n{spec.index}\n".encode()
        return (line * (size // len(line) + 1))[:size]
    if spec.mime == "image/png":
        rgb = hashlib.sha256(f"{spec.run_id}/{spec.round}/{spec.index}".encode()).digest()[:3]
        base = solid_png(1, 1, rgb)
        if size >= len(base) + 12:
            return solid_png(1, 1, rgb, min_bytes=size)
        return base[:size]
    head = b"\xffSIM-" + spec.mime.encode()
    return (head + bytes(range(256)) * (size // 256 + 1))[:size]


def file_event_data(spec: FileSpec) -> dict[str, Any]:
    """The ``file_produced`` data (a ``File``), elided over the embed limit."""
    ext = _EXTENSIONS.get(spec.mime, "bin")
    body: dict[str, Any] = {
        "id": f"file_{spec.run_id}_r{spec.round}_{spec.index}",
        "name": f"sim-r{spec.round}-{spec.index}.{ext}",
        "format": ext,
        "mime_type": spec.mime,
        "bytes": spec.size if spec.declared is None else spec.declared,
        "created_at": spec.created_at,
        "purpose": "agent_output",
        "source": {"tool": spec.tool_name, "round": spec.round, "turn": spec.turn},
    }
    embedded = spec.size <= EMBED_LIMIT
    if _is_text(spec.mime):
        preview = file_bytes(dataclasses.replace(spec, size=min(spec.size, PREVIEW_CHARS)))
        preview_text = preview.decode()
        if embedded:
            body["text"] = file_bytes(spec).decode()
        body["preview"] = preview_text
    elif embedded:
        body["data_base64"] = base64.b64encode(file_bytes(spec)).decode("ascii")
    return body
