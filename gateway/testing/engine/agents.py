"""The engine's agentic loop behind the adapter, and the adapter's framing of it (test equipment).

What is real and what is framed
-------------------------------

The PyPI binding runs the engine's real agentic loop (``agentic_loop.rs``):
the model's tool call, ``max_tool_rounds``, the session, the approval
callback, the search callback and every generation are the engine's. But the
binding **drops the loop's streamed events** (``agentic_tool_call_progress``,
``agentic_tool_approval_required``, ``file_produced``: its streamer skips
them), so the worker's wire events cannot come from the engine. The adapter
writes them itself, in the worker's exact JSON shapes
(``shared/reference/mistralrs-agents-media.md`` §3.4), from what the engine's
callbacks show it:

* **the approval callback** is the first thing the engine runs after it
  announced a tool call (``approve_agent_tool``, right after its ``calling``
  event). The adapter therefore writes ``phase: "calling"`` (the tool's name
  from the approval's metadata, the inverse of ``tool_metadata_for``; its
  data from the arguments as ``calling_data_for_tool`` builds it), then, for
  ``ask``, ``agentic_tool_approval_required`` with the engine's own
  ``approval_id``, ``session_id``, ``round``, tool metadata and arguments
  text, and waits for ``POST /v1/agent/approvals/{id}`` on the adapter (at
  most ``approval_timeout_s``; then denied ``Approval timed out.``, as the
  server's broker does);
* a **denial** is written as the engine reports one (``denied_tool_result``:
  a ``custom`` complete whose content is ``{"status":"denied","exception":…}``)
  when the callback returns it -- the engine writes that tool message next;
* an **approved search** reaches the engine's **search callback**, which
  answers from a local stub (never the network) and writes ``phase:
  "complete"`` with the count and the domains of what it returned (the
  engine's ``web_search_metadata`` reads the same results back; the engine
  ranks them by BM25, and the stub's results carry one text each, so the
  engine keeps the stub's order). A round whose search callback never ran
  (arguments the engine could not parse) is completed with bare
  ``{"tool_type":"web_search"}`` before the next chunk, as the engine's would
  be.

Every agentic request runs with the engine's ``Ask`` permission and this
approval callback, whatever it asked: the callback is the only place the
adapter sees a tool call. ``auto`` is approved by the callback (no approval
event, as the worker sends none), ``deny`` is denied with the engine's own
message ``<label> was denied by policy.``. The page extractor
(``mistralrs_website_content_extractor``) always fetches its URL over the
network (the search callback does not replace it), so the adapter **never
lets it run**: an approval of it becomes a denial ("The engine adapter never
runs page extraction: it would fetch the network."), which the gateway's
event machine accepts (a worker may deny by itself). ``remember_for_session``
is not passed on: later rounds would skip the callback and the adapter could
not see them.

Threads: the engine calls both callbacks on threads of its own (tokio's
blocking pool; Python sees them as ``Dummy-N``). They touch the adapter's
event loop only through ``loop.call_soon_threadsafe`` (events go into the
stream's :class:`Sink`, in the order written), and wait for a decision on a
``threading.Event`` with a deadline. Whatever a callback writes before it
returns reaches the stream before the engine's next chunk: the engine makes
that chunk after the callback returned, and the loop runs thread-safe
callbacks in the order they were scheduled.

The search callback belongs to the engine, not to a request; it finds its run
among the approved searches still waiting for it (the first with the same
query). ``filters.allowed_domains`` cannot reach the engine (the binding's
``WebSearchOptions`` has no ``filters``), so the stub answers from the
allowed domains itself -- what the worker's filter would have left.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import mistralrs

from gateway.testing.engine import serde

SEARCH_TOOL = "mistralrs_search_the_web"
EXTRACT_TOOL = "mistralrs_website_content_extractor"
#: the server's broker waits this long for a decision (``APPROVAL_TIMEOUT``)
DEFAULT_APPROVAL_TIMEOUT_S = 300.0
EXTRACT_REFUSED = "The engine adapter never runs page extraction: it would fetch the network."
TIMED_OUT = "Approval timed out."
DENIED = "Agent action was denied."
#: the stub's answer: one result per allowed domain (at most this many)
STUB_RESULTS = 3
STUB_DOMAIN = "search.example"
STUB_TEXT = "a local stub: no network"
_RUNS_KEPT = 256

# The model's own turns (modelgen.CHAT_TEMPLATE) plus the turns the agentic loop
# adds: an assistant turn with ``tool_calls`` (content "") and a ``tool`` turn
# (``name``, ``content``: the tool's result). The model's template refuses role
# ``tool``, so the agentic Runner loads this one (``jinja_explicit``).
AGENT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'tool' %}"
    "{{ '<|user|>\\n[tool ' + message['name'] + '] ' + message['content'] + eos_token + '\\n' }}"
    "{% elif message['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|' + message['role'] + '|>\\n' + (message['content'] or '') + eos_token + '\\n' }}"
    "{% else %}"
    "{{ raise_exception('roles are system, user, assistant and tool') }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_SOURCES = {
    "BuiltIn": "built_in",
    "User": "user",
    "Mcp": "mcp",
    "External": "external",
}
_KINDS = {
    "CodeExecution": "code_execution",
    "WebSearch": "web_search",
    "Shell": "shell",
    "File": "file",
    "Custom": "custom",
    "External": "external",
}
# The built-in tools as ``tool_metadata_for`` labels them (the approval has no tool name).
_BUILTIN_BY_LABEL = {
    ("web_search", "Web search"): SEARCH_TOOL,
    ("web_search", "Web page extraction"): EXTRACT_TOOL,
    ("code_execution", "Python code"): "mistralrs_execute_python",
    ("shell", "Shell command"): "mistralrs_shell",
}


def _enum_name(value: Any) -> str:
    return str(value).rsplit(".", 1)[-1]


def event_frame(name: str, payload: bytes) -> bytes:
    """One named SSE event as axum writes it (``event:`` then ``data:``)."""
    return b"event: " + name.encode() + b"\ndata: " + payload + b"\n\n"


def progress_payload(round_: int, tool_name: str, phase: str, data: dict[str, Any]) -> bytes:
    """``serialize_agentic_progress``: the keys in the server's order."""
    return serde.dumps(
        {
            "type": "agentic_tool_call_progress",
            "round": round_,
            "tool_name": tool_name,
            "phase": phase,
            "data": data,
        }
    )


def approval_payload(
    approval_id: str, session_id: str, round_: int, tool: dict[str, str], arguments_json: str
) -> bytes:
    """The server's ``agentic_tool_approval_required`` object; ``arguments`` are the
    engine's own JSON text of the parsed arguments (serde_json's bytes, kept)."""
    head = serde.dumps(
        {
            "type": "agentic_tool_approval_required",
            "approval_id": approval_id,
            "session_id": session_id,
            "round": round_,
            "tool": tool,
        }
    )
    return head[:-1] + b',"arguments":' + arguments_json.encode("utf-8") + b"}"


def calling_data(tool_name: str, kind: str, arguments_json: str) -> dict[str, Any]:
    """``calling_data_for_tool`` for the tools a binding-run engine can call."""
    if tool_name in (SEARCH_TOOL, EXTRACT_TOOL):
        data: dict[str, Any] = {"tool_type": "web_search"}
        query = _field(arguments_json, "query")
        if isinstance(query, str):
            data["query"] = query
        return data
    if kind == "code_execution":
        data = {"tool_type": "code_execution"}
        code = _field(arguments_json, "code")
        if isinstance(code, str):
            data["code"] = code
        return data
    if kind == "shell":
        commands = _field(arguments_json, "commands")
        listed = [c for c in commands if isinstance(c, str)] if isinstance(commands, list) else []
        return {"tool_type": "shell", "commands": listed}
    data = {"tool_type": "custom"}
    if arguments_json:
        data["arguments"] = arguments_json
    return data


def denied_data(kind: str, message: str) -> dict[str, Any]:
    """``denied_tool_result``'s complete data (code and shell as the engine writes them)."""
    if kind == "code_execution":
        return {"tool_type": "code_execution", "exception": message}
    content = serde.dumps({"status": "denied", "exception": message}).decode("utf-8")
    return {"tool_type": "custom", "content": content}


def source_domains(urls: list[str]) -> list[str]:
    """``search::source_domains``: each URL's host, lowercased, ``www.`` dropped, once each."""
    seen: list[str] = []
    for url in urls:
        host = (urlsplit(url).hostname or "").rstrip(".").lower()
        host = host.removeprefix("www.")
        if host and host not in seen:
            seen.append(host)
    return seen


def _field(arguments_json: str, key: str) -> Any:
    try:
        value = json.loads(arguments_json)
    except ValueError:
        return None
    return value.get(key) if isinstance(value, dict) else None


class Sink:
    """One stream's agentic events, written from engine threads, read on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.frames: collections.deque[bytes] = collections.deque()
        self.arrived = asyncio.Event()

    def push(self, frame: bytes) -> None:
        """From any thread: queue ``frame`` behind every frame pushed before it."""
        self._loop.call_soon_threadsafe(self._append, frame)

    def _append(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.arrived.set()

    def drain(self) -> list[bytes]:
        """On the loop: the frames queued so far, in order."""
        out = list(self.frames)
        self.frames.clear()
        self.arrived.clear()
        return out


@dataclass
class RoundRecord:
    """One tool round as the adapter saw it (``GET /adapter/agent-runs``)."""

    round: int
    tool_name: str
    kind: str
    label: str
    arguments: str
    approval_id: str | None
    #: approve | deny
    decision: str = ""
    #: caller (a POST to the approval route) | adapter (auto, deny, the
    #: extractor) | timeout
    by: str = ""
    message: str | None = None
    #: the engine called its search callback for this round
    searched: bool = False
    query: str | None = None
    results_count: int | None = None
    sources: list[str] = field(default_factory=list)
    completed: bool = False


@dataclass
class RunRecord:
    """One agentic request (``GET /adapter/agent-runs``)."""

    run: int
    #: the body's ``session_id``, ``max_tool_rounds``, ``agent_permission`` as received
    requested_session_id: str | None
    max_tool_rounds: int | None
    permission: str
    allowed_domains: list[str]
    #: the session the engine ran (its approvals and final chunk name it)
    engine_session_id: str | None = None
    rounds: list[RoundRecord] = field(default_factory=list)
    #: finished | unfinished (no final chunk) | failed | dropped | answered (not streamed)
    outcome: str | None = None
    #: the engine's error message (outcome failed)
    error: str | None = None


@dataclass
class _Pending:
    session_id: str
    done: threading.Event = field(default_factory=threading.Event)
    approve: bool = False
    message: str | None = None


class AgentDesk:
    """The engine's callbacks and the adapter's approval route; one per engine."""

    def __init__(self, approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S) -> None:
        self.approval_timeout_s = approval_timeout_s
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._awaiting_search: list[tuple[AgentRun, RoundRecord]] = []
        self._numbers = itertools.count(1)
        self.runs: collections.deque[RunRecord] = collections.deque(maxlen=_RUNS_KEPT)
        #: searches the engine ran that no approved round was waiting for
        self.unattributed_searches = 0
        self._closed = False

    def start(self, body: dict[str, Any], permission: str, sink: Sink | None) -> AgentRun:
        """A run for one agentic request (``permission``: auto, ask or deny)."""
        options = body.get("web_search_options")
        filters = options.get("filters") if isinstance(options, dict) else None
        allowed = filters.get("allowed_domains") if isinstance(filters, dict) else None
        rounds = body.get("max_tool_rounds")
        session = body.get("session_id")
        record = RunRecord(
            run=next(self._numbers),
            requested_session_id=session if isinstance(session, str) else None,
            max_tool_rounds=rounds if isinstance(rounds, int) else None,
            permission=permission,
            allowed_domains=[d for d in allowed or [] if isinstance(d, str)],
        )
        self.runs.append(record)
        return AgentRun(self, record, permission, sink)

    # -- the approval route (on the loop) -------------------------------------

    def resolve(self, approval_id: str, approve: bool, message: str | None) -> str:
        """``POST /v1/agent/approvals/{id}``: ``resolved`` or ``not_found``. The
        adapter registers an approval before it writes the event, so the
        server's ``queued`` (a decision before the wait began) cannot happen."""
        with self._lock:
            pending = self._pending.pop(approval_id, None)
        if pending is None:
            return "not_found"
        pending.approve, pending.message = approve, message
        pending.done.set()
        return "resolved"

    def close(self) -> None:
        """Deny every approval still waited for (the adapter is stopping)."""
        with self._lock:
            self._closed = True
            pending, self._pending = list(self._pending.values()), {}
        for entry in pending:
            entry.approve, entry.message = False, "The engine adapter is stopping."
            entry.done.set()

    # -- the engine's callbacks (engine threads) ------------------------------

    def search(self, query: str) -> list[dict[str, str]]:
        """The engine's search callback: the stub's results, never the network."""
        with self._lock:
            owner = next(
                (i for i, (_, r) in enumerate(self._awaiting_search) if r.query == query), None
            )
            run, record = self._awaiting_search.pop(owner) if owner is not None else (None, None)
            if run is None:
                self.unattributed_searches += 1
        domains = run.record.allowed_domains if run is not None else []
        hosts = [d.removeprefix("www.") for d in domains if "*" not in d][:STUB_RESULTS]
        results = [
            {
                "title": f"stub {index}",
                "description": "",
                "url": f"https://{host}/{index}",
                "content": STUB_TEXT,
            }
            for index, host in enumerate(hosts or [STUB_DOMAIN])
        ]
        if run is not None and record is not None:
            run.searched(record, results)
        return results

    def _wait(self, approval_id: str, session_id: str) -> _Pending:
        entry = _Pending(session_id)
        with self._lock:
            if self._closed:
                entry.message = "The engine adapter is stopping."
                return entry
            self._pending[approval_id] = entry
        return entry

    def _forget(self, approval_id: str) -> None:
        with self._lock:
            self._pending.pop(approval_id, None)

    def _await_search(self, run: AgentRun, record: RoundRecord) -> None:
        with self._lock:
            self._awaiting_search.append((run, record))

    def _drop_search(self, record: RoundRecord) -> None:
        with self._lock:
            self._awaiting_search = [e for e in self._awaiting_search if e[1] is not record]


class AgentRun:
    """One agentic request: its approval callback, its record, its stream's events."""

    def __init__(
        self, desk: AgentDesk, record: RunRecord, permission: str, sink: Sink | None
    ) -> None:
        self.desk = desk
        self.record = record
        self.permission = permission
        self.sink = sink
        self._lock = threading.Lock()
        self._open: RoundRecord | None = None

    def callback(self) -> Callable[[Any], mistralrs.AgentToolApprovalDecision]:
        return self._on_approval

    # -- engine threads --------------------------------------------------------

    def _on_approval(self, approval: Any) -> mistralrs.AgentToolApprovalDecision:
        """The engine's approval callback (see the module docstring)."""
        kind = _KINDS.get(_enum_name(approval.tool.kind), "custom")
        source = _SOURCES.get(_enum_name(approval.tool.source), "user")
        label = str(approval.tool.label)
        name = _BUILTIN_BY_LABEL.get((kind, label), label)
        arguments = str(approval.arguments_json)
        round_ = int(approval.round)
        session = str(approval.session_id)
        ask = self.permission == "ask"
        record = RoundRecord(
            round=round_,
            tool_name=name,
            kind=kind,
            label=label,
            arguments=arguments,
            approval_id=str(approval.approval_id) if ask else None,
        )
        if name == SEARCH_TOOL:
            query = _field(arguments, "query")
            record.query = query if isinstance(query, str) else None
        with self._lock:
            self.record.engine_session_id = session
            self.record.rounds.append(record)
            self._open = record
        self._push(event_frame(
            "agentic_tool_call_progress",
            progress_payload(round_, name, "calling", calling_data(name, kind, arguments)),
        ))  # fmt: skip
        approve, message, by = self._decide(approval, record, source, session)
        if approve and name == EXTRACT_TOOL:
            approve, message, by = False, EXTRACT_REFUSED, "adapter"
        record.decision, record.by, record.message = (
            ("approve" if approve else "deny"), by, message,
        )  # fmt: skip
        if not approve:
            self._complete(record, denied_data(kind, message or DENIED))
            return mistralrs.AgentToolApprovalDecision.deny(message)
        if name == SEARCH_TOOL:
            self.desk._await_search(self, record)
        return mistralrs.AgentToolApprovalDecision.approve()

    def _decide(
        self, approval: Any, record: RoundRecord, source: str, session: str
    ) -> tuple[bool, str | None, str]:
        if self.permission == "auto":
            return True, None, "adapter"
        if self.permission == "deny":
            return False, f"{record.label} was denied by policy.", "adapter"
        approval_id = str(approval.approval_id)
        entry = self.desk._wait(approval_id, session)
        if entry.message is not None:  # the adapter is stopping
            return False, entry.message, "adapter"
        tool = {"source": source, "kind": record.kind, "label": record.label}
        self._push(event_frame(
            "agentic_tool_approval_required",
            approval_payload(approval_id, session, record.round, tool, record.arguments),
        ))  # fmt: skip
        if not entry.done.wait(self.desk.approval_timeout_s):
            self.desk._forget(approval_id)
            return False, TIMED_OUT, "timeout"
        return entry.approve, entry.message, "caller"

    def searched(self, record: RoundRecord, results: list[dict[str, str]]) -> None:
        """The engine's search callback ran for ``record``: its complete event."""
        record.searched = True
        record.results_count = len(results)
        record.sources = source_domains([r["url"] for r in results])
        data: dict[str, Any] = {"tool_type": "web_search", "results_count": len(results)}
        if record.sources:
            data["sources"] = list(record.sources)
        self._complete(record, data)

    def _complete(self, record: RoundRecord, data: dict[str, Any]) -> None:
        frame = self._completion(record, data)
        if frame is not None:
            self._push(frame)

    def _completion(self, record: RoundRecord, data: dict[str, Any]) -> bytes | None:
        """The round's ``phase: "complete"`` frame, once (None: already written)."""
        with self._lock:
            if record.completed:
                return None
            record.completed = True
            if self._open is record:
                self._open = None
        payload = progress_payload(record.round, record.tool_name, "complete", data)
        return event_frame("agentic_tool_call_progress", payload)

    def _push(self, frame: bytes) -> None:
        if self.sink is not None:
            self.sink.push(frame)

    # -- the loop ----------------------------------------------------------------

    def settle_open_round(self) -> bytes | None:
        """On the loop, before the next chunk or the end: the complete frame of a
        round whose search callback never ran (the engine could not parse its
        arguments), as the engine's would be (``web_search_metadata`` of an
        error: no count, no sources); to be written at once."""
        with self._lock:
            record = self._open
        if record is None or record.decision != "approve":
            return None
        self.desk._drop_search(record)
        return self._completion(record, {"tool_type": "web_search"})

    def saw_session(self, session_id: str | None) -> None:
        if session_id:
            self.record.engine_session_id = session_id

    def finish(self, outcome: str, error: str | None = None) -> None:
        self.record.outcome = outcome
        if error is not None:
            self.record.error = error


def runs_json(desk: AgentDesk) -> list[dict[str, Any]]:
    """``GET /adapter/agent-runs``: every run kept, oldest first."""
    return [dataclasses.asdict(run) for run in list(desk.runs)]
