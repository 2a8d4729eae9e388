"""The worker's agentic events as mistral.rs 0.9.2 writes them (reference §3.4;
``chat_completion.rs`` ``serialize_agentic_progress``, ``agentic_loop.rs``
``denied_tool_result``, ``files/mod.rs``), for the tests to feed."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

SESSION = "gs_" + "ab" * 16


@dataclass(frozen=True)
class Tool:
    name: str
    tool_type: str
    kind: str
    calling: dict[str, Any]
    arguments: Any
    output: dict[str, Any]

    @property
    def label(self) -> str:
        return {
            "web_search": "Web search",
            "code_execution": "Python code",
            "file": "File access",
        }.get(self.kind, self.name)

    @property
    def source(self) -> str:
        return "built_in" if self.kind != "custom" else "user"


PYTHON = Tool(
    "mistralrs_execute_python",
    "code_execution",
    "code_execution",
    {"tool_type": "code_execution", "code": "print(2 + 2)"},
    {"code": "print(2 + 2)"},
    {"tool_type": "code_execution", "stdout": "4\n", "execution_time_ms": 12},
)
SEARCH = Tool(
    "mistralrs_search_the_web",
    "web_search",
    "web_search",
    {"tool_type": "web_search", "query": "rust sse"},
    {"query": "rust sse"},
    {"tool_type": "web_search", "results_count": 2, "sources": ["docs.rs", "en.wikipedia.org"]},
)
EXTRACT = Tool(
    "mistralrs_website_content_extractor",
    "web_search",
    "web_search",
    {"tool_type": "web_search"},
    {"url": "https://docs.example.com/page"},
    {"tool_type": "web_search", "results_count": 1, "sources": ["docs.example.com"]},
)
MCP = Tool(
    "docs_search",
    "custom",
    "custom",
    {"tool_type": "custom", "arguments": '{"q": "sse"}'},
    {"q": "sse"},
    {"tool_type": "custom", "content": "two pages"},
)
READ_FILE = Tool(
    "mistralrs_read_file",
    "custom",
    "file",
    {"tool_type": "custom", "arguments": '{"file_id": "f"}'},
    {"file_id": "f"},
    {"tool_type": "custom", "content": "hello"},
)
TOOLS = (PYTHON, SEARCH, EXTRACT, MCP, READ_FILE)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def calling(round: int, tool: Tool) -> tuple[str, str]:
    return "agentic_tool_call_progress", dumps(
        {
            "type": "agentic_tool_call_progress",
            "round": round,
            "tool_name": tool.name,
            "phase": "calling",
            "data": tool.calling,
        }
    )


def denial(
    tool: Tool, message: str = "Denied by the gateway (tool_not_allowed)."
) -> dict[str, Any]:
    """What ``denied_tool_result`` reports for ``tool``."""
    if tool.tool_type == "code_execution":
        return {"tool_type": "code_execution", "exception": message}
    content = dumps({"status": "denied", "exception": message})
    return {"tool_type": "custom", "content": content}


def complete(round: int, tool: Tool, data: dict[str, Any] | None = None) -> tuple[str, str]:
    return "agentic_tool_call_progress", dumps(
        {
            "type": "agentic_tool_call_progress",
            "round": round,
            "tool_name": tool.name,
            "phase": "complete",
            "data": tool.output if data is None else data,
        }
    )


def approval(
    round: int,
    tool: Tool,
    *,
    approval_id: str | None = None,
    arguments_json: str | None = None,
    session: str = SESSION,
) -> tuple[str, str]:
    arguments = dumps(tool.arguments) if arguments_json is None else arguments_json
    approval_id = approval_id or f"appr_{round:032x}"
    tool_json = dumps({"source": tool.source, "kind": tool.kind, "label": tool.label})
    return "agentic_tool_approval_required", (
        '{"type":"agentic_tool_approval_required",'
        f'"approval_id":"{approval_id}","session_id":"{session}","round":{round},'
        f'"tool":{tool_json},"arguments":{arguments}}}'
    )


def produced(
    round: int,
    name: str,
    body: bytes | str | None,
    *,
    mime: str | None = None,
    declared: int | None = None,
    tool: Tool = PYTHON,
) -> tuple[str, str]:
    size = declared
    file: dict[str, Any] = {
        "id": f"file_0123456789ab_r{round}_0",
        "name": name,
        "format": name.rpartition(".")[2],
        "created_at": 1_760_000_000,
        "purpose": "agent_output",
        "source": {"tool": tool.name, "round": round, "turn": 0},
    }
    if mime is not None:  # the worker leaves a None out
        file["mime_type"] = mime
    if isinstance(body, str):
        file.update(text=body, preview=body[:4096])
        size = len(body.encode()) if size is None else size
    elif isinstance(body, bytes):
        file["data_base64"] = base64.b64encode(body).decode()
        size = len(body) if size is None else size
    file["bytes"] = 9_000_000 if size is None else size
    return "file_produced", dumps(file)
