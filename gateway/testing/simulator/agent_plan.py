"""The ``agent`` knob: which tool the simulated model calls in each round of an
agentic chat run. Pure; imports nothing of the simulator.

Syntax: entries separated by commas, one a round, each ``kind`` or
``kind:argument``. The argument is percent-decoded (``%20`` a space, ``%2C`` a
comma, ``%5D`` a ``]``), so a ``[[sim agent=...]]`` directive stays one word::

    web:<query>     mistralrs_search_the_web (query; default "sim query <round>").
                    A query starting with http:// or https:// is one the worker
                    fetches directly.
    url:<url>       mistralrs_website_content_extractor (the URL; required)
    python[:<code>] mistralrs_execute_python (the code; default print("sim-python-<round>"))
    mcp:<name>      an MCP tool, named as the worker names it (<tool_prefix>_<name>)
    tool:<name>     a registered custom tool (the same bytes as mcp: the worker
                    reports both as source "user", kind "custom")
    file[:read|list] mistralrs_read_file (default) or mistralrs_list_files
    shell[:<cmd>]   mistralrs_shell (the command; default "echo sim")

At most 64 entries; an unknown kind, a missing required argument or an empty
entry is a ``ValueError`` (the directive's 400).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

MAX_ROUNDS_IN_PLAN = 64
KINDS = frozenset({"web", "url", "python", "mcp", "tool", "file", "shell"})
_REQUIRED = frozenset({"url", "mcp", "tool"})


@dataclass(frozen=True, slots=True)
class PlanEntry:
    kind: str
    arg: str | None


def parse_plan(text: str) -> tuple[PlanEntry, ...]:
    """``"web:rust,python"`` → its entries; ``""`` → none."""
    if not text:
        return ()
    entries: list[PlanEntry] = []
    for raw in text.split(","):
        kind, sep, arg = raw.partition(":")
        if kind not in KINDS:
            known = ", ".join(sorted(KINDS))
            raise ValueError(f"agent: unknown tool kind {kind!r} (kinds: {known})")
        value = unquote(arg) if sep else None
        if kind in _REQUIRED and not value:
            raise ValueError(f"agent: {kind} needs an argument ({kind}:...)")
        if kind == "file" and value not in (None, "read", "list"):
            raise ValueError("agent: file takes read or list")
        entries.append(PlanEntry(kind, value or None))
    if len(entries) > MAX_ROUNDS_IN_PLAN:
        raise ValueError(f"agent: at most {MAX_ROUNDS_IN_PLAN} rounds")
    return tuple(entries)
