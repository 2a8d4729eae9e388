"""The worker's agentic event payloads, read into typed records (reference §3.4). Pure.

What ``agentic_tool_call_progress``, ``agentic_tool_approval_required`` and
``file_produced`` carry (mistral.rs ``chat_completion.rs``
``serialize_agentic_progress``, ``agentic_loop.rs``, ``files/mod.rs``), each
checked for shape and size here; *which may follow which* is
``events.py``'s. Every failure is a :func:`~gateway.core.sse.violation` with a
fixed message (payloads are model output and never go into messages).

* A payload is one JSON object, read member by member (``jsonspans.py``) so
  an approval's ``arguments`` keep the exact bytes the worker sent (receipts
  hash them, spec §24) next to their parsed value.
* Built-in tool names fix the progress ``tool_type`` and the approval
  ``tool.kind`` (:data:`BUILTIN_TYPES`, :data:`BUILTIN_KINDS`); any other name
  is ``custom`` (MCP and callbacks), whose approval label is the tool's name.
  An approval of an unknown kind is read, not refused: the approval rules
  deny what they do not know.
* A denial is reported by the worker in a fixed shape
  (``denied_tool_result``): code execution as only an ``exception``; shell as
  ``status: "denied"``; every other tool, web search included, as ``custom``
  with ``content`` ``{"status": "denied", "exception": …}`` and no
  ``arguments``. :func:`is_denial` recognizes exactly these.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from gateway.core.sse import violation

__all__ = [
    "BUILTIN_KINDS",
    "BUILTIN_TYPES",
    "ApprovalRequired",
    "FileBody",
    "Progress",
    "ToolCalling",
    "ToolComplete",
    "is_denial",
    "read_approval",
    "read_calling",
    "read_complete",
    "read_file",
    "read_progress",
]

ToolType = Literal["code_execution", "web_search", "shell", "custom"]

SEARCH = "mistralrs_search_the_web"
EXTRACT = "mistralrs_website_content_extractor"
#: the progress ``tool_type`` of each built-in tool (``calling_data_for_tool``)
BUILTIN_TYPES: Final[dict[str, ToolType]] = {
    SEARCH: "web_search",
    EXTRACT: "web_search",
    "mistralrs_execute_python": "code_execution",
    "mistralrs_reset_python_session": "code_execution",
    "mistralrs_read_file": "custom",
    "mistralrs_list_files": "custom",
    "mistralrs_surface_outputs": "custom",
    "mistralrs_shell": "shell",
}
#: the approval ``tool.kind`` of each built-in tool (``tool_metadata_for``)
BUILTIN_KINDS: Final[dict[str, str]] = {
    SEARCH: "web_search",
    EXTRACT: "web_search",
    "mistralrs_execute_python": "code_execution",
    "mistralrs_reset_python_session": "code_execution",
    "mistralrs_read_file": "file",
    "mistralrs_list_files": "file",
    "mistralrs_surface_outputs": "file",
    "mistralrs_shell": "shell",
}
_TOOL_TYPES: Final = frozenset(("code_execution", "web_search", "shell", "custom"))
_APPROVAL_ID: Final = re.compile(r"appr_[0-9a-f]{32}")
_MAX_NAME: Final = 256
_MAX_SOURCES: Final = 64


def _value(fields: dict[str, tuple[Any, str]], key: str) -> Any:
    entry = fields.get(key)
    return None if entry is None else entry[0]


def _index(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise violation(f"Upstream sent an agentic event whose {what} is not a round index.")
    return value


def _text(value: Any, limit: int, what: str) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise violation(f"Upstream sent an agentic event whose {what} is malformed or too long.")
    return value


def _optional_text(value: Any, limit: int, what: str) -> str | None:
    return None if value is None else _text(value, limit, what)


@dataclass(frozen=True, slots=True)
class Progress:
    """An ``agentic_tool_call_progress`` payload, before its phase is judged."""

    phase: Literal["calling", "complete"]
    round: int
    tool_name: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCalling:
    """The worker is about to run a tool (``phase: "calling"``)."""

    round: int
    tool_name: str
    tool_type: ToolType
    #: web_search: the query (absent for page extraction: its URL is in the approval)
    query: str | None = None
    #: code_execution: the code
    code: str | None = None
    #: custom: the arguments as the model wrote them (a JSON text, unchecked)
    arguments: str | None = None


@dataclass(frozen=True, slots=True)
class ApprovalRequired:
    """The worker waits for a decision on this round's call (never relayed as is)."""

    round: int
    approval_id: str
    session_id: str
    tool_name: str
    #: ``web_search``, ``code_execution``, ``file``, ``shell``, ``custom``, ``external``…
    kind: str
    label: str
    source: str
    #: the parsed arguments, or the raw string when the model's were not JSON
    arguments: Any
    #: the arguments exactly as the worker sent them (what receipts hash)
    arguments_json: bytes


@dataclass(frozen=True, slots=True)
class ToolComplete:
    """The round's tool finished, or the worker reports its denial."""

    round: int
    tool_name: str
    tool_type: ToolType
    denied: bool
    #: web_search: the result domains (no other tool output is carried)
    sources: tuple[str, ...] = ()
    results_count: int | None = None


@dataclass(frozen=True, slots=True)
class FileBody:
    """A ``file_produced`` payload before the run's file bounds are applied."""

    round: int
    name: str
    mime_type: str | None
    declared_bytes: int
    text: str | None
    data_base64: str | None
    placeholder: bool


def _check_type(fields: dict[str, tuple[Any, str]], name: str) -> None:
    if _value(fields, "type") not in (None, name):
        raise violation("Upstream sent an agentic event whose type is not its name.")


def read_progress(fields: dict[str, tuple[Any, str]]) -> Progress:
    _check_type(fields, "agentic_tool_call_progress")
    phase = _value(fields, "phase")
    if phase not in ("calling", "complete"):
        raise violation("Upstream sent a tool progress event with an unknown phase.")
    data = _value(fields, "data")
    if not isinstance(data, dict) or data.get("tool_type") not in _TOOL_TYPES:
        raise violation("Upstream sent a tool progress event without known tool data.")
    name = _text(_value(fields, "tool_name"), _MAX_NAME, "tool name")
    return Progress(phase, _index(_value(fields, "round"), "round"), name, data)


def read_calling(progress: Progress, limit: int) -> ToolCalling:
    data = progress.data
    tool_type: ToolType = data["tool_type"]
    if tool_type != BUILTIN_TYPES.get(progress.tool_name, "custom"):
        raise violation("Upstream reported a tool call whose type does not fit its tool.")
    return ToolCalling(
        progress.round,
        progress.tool_name,
        tool_type,
        query=_optional_text(data.get("query"), limit, "query"),
        code=_optional_text(data.get("code"), limit, "code"),
        arguments=_optional_text(data.get("arguments"), limit, "arguments"),
    )


def is_denial(data: dict[str, Any]) -> bool:
    """The worker's report of a denied call (``denied_tool_result``), and nothing more."""
    tool_type = data.get("tool_type")
    keys = set(data)
    if tool_type == "code_execution":
        return keys <= {"tool_type", "exception"} and isinstance(data.get("exception"), str)
    if tool_type == "shell":
        ran = {"stdout", "exit_code", "working_directory"}
        return data.get("status") == "denied" and not (keys & ran)
    if tool_type == "custom" and keys <= {"tool_type", "content"}:
        try:
            content = json.loads(data.get("content", ""))
        except (TypeError, ValueError):
            return False
        return isinstance(content, dict) and content.get("status") == "denied"
    return False


def read_complete(progress: Progress, calling: ToolCalling, approved: bool) -> ToolComplete:
    """A ``complete``; a tool reported as run needs the gateway's approve."""
    data = progress.data
    if progress.tool_name != calling.tool_name:
        raise violation("Upstream completed another tool than the round called.")
    denied = is_denial(data)
    if not denied and not approved:
        raise violation("Upstream reported a tool as run that the gateway did not approve.")
    if not denied and data["tool_type"] != calling.tool_type:
        raise violation("Upstream completed a tool call with another type than it called.")
    sources: tuple[str, ...] = ()
    count = None
    if data["tool_type"] == "web_search":
        raw = data.get("sources", [])
        if not isinstance(raw, list) or len(raw) > _MAX_SOURCES:
            raise violation("Upstream sent web search sources that are malformed or too many.")
        sources = tuple(_text(s, _MAX_NAME, "source") for s in raw)
        found = data.get("results_count")
        count = None if found is None else _index(found, "result count")
    return ToolComplete(
        progress.round, progress.tool_name, data["tool_type"], denied, sources, count
    )


def read_approval(
    fields: dict[str, tuple[Any, str]], calling: ToolCalling, limit: int
) -> ApprovalRequired:
    _check_type(fields, "agentic_tool_approval_required")
    approval_id = _value(fields, "approval_id")
    # The id goes into the path of the gateway's decision: exactly the worker's shape.
    if not isinstance(approval_id, str) or not _APPROVAL_ID.fullmatch(approval_id):
        raise violation("Upstream sent an approval id of an unknown shape.")
    session = _text(_value(fields, "session_id"), _MAX_NAME, "session id")
    tool = _value(fields, "tool")
    if not isinstance(tool, dict):
        raise violation("Upstream sent an approval without its tool.")
    kind = _text(tool.get("kind"), _MAX_NAME, "tool kind")
    label = _text(tool.get("label"), _MAX_NAME, "tool label")
    source = _text(tool.get("source"), _MAX_NAME, "tool source")
    builtin = BUILTIN_KINDS.get(calling.tool_name)
    if builtin is not None and kind != builtin:
        raise violation("Upstream sent an approval whose kind does not fit its tool.")
    if kind in ("custom", "external") and label != calling.tool_name:
        raise violation("Upstream sent an approval for another tool than the round called.")
    if "arguments" not in fields:
        raise violation("Upstream sent an approval without arguments.")
    arguments, raw = fields["arguments"]
    encoded = raw.encode("utf-8", "surrogatepass")
    if len(encoded) > limit:
        raise violation("Upstream sent approval arguments over the size limit.")
    return ApprovalRequired(
        _index(_value(fields, "round"), "round"),
        approval_id,
        session,
        calling.tool_name,
        kind,
        label,
        source,
        arguments,
        encoded,
    )


def read_file(fields: dict[str, tuple[Any, str]]) -> FileBody:
    source = _value(fields, "source")
    if not isinstance(source, dict):
        raise violation("Upstream sent a produced file without its source.")
    declared = _value(fields, "bytes")
    if type(declared) is not int or declared < 0:
        raise violation("Upstream sent a produced file without its size.")
    mime = _value(fields, "mime_type")
    text = _value(fields, "text")
    data = _value(fields, "data_base64")
    if (text is not None and not isinstance(text, str)) or (
        data is not None and not isinstance(data, str)
    ):
        raise violation("Upstream sent a produced file whose body is not a string.")
    return FileBody(
        round=_index(source.get("round"), "round"),
        name=_text(_value(fields, "name"), 4096, "file name"),
        mime_type=mime if isinstance(mime, str) and len(mime) <= _MAX_NAME else None,
        declared_bytes=declared,
        text=text,
        data_base64=data,
        placeholder="code" in fields and "message" in fields,
    )
