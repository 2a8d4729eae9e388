"""The layer contract holds and no module imports itself in a circle.

``make lint`` runs import-linter's contracts (``pyproject.toml``); this runs
the same contracts from the suite, so a plain ``pytest`` run catches a broken
arrow too, and checks what the layers contract cannot see: a cycle between
modules of one layer, including one closed only by ``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]


def _cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # Iterative: the module graph is deep enough to worry recursion limits.
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if not child.startswith("gateway"):
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)

    for module in sorted(graph.modules):
        if module.startswith("gateway") and module not in index:
            visit(module)
    return found


def test_no_import_cycle_not_even_through_type_checking() -> None:
    graph = grimp.build_graph("gateway", exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    graph = grimp.build_graph("gateway", exclude_type_checking_imports=False)
    graph.add_import(importer="gateway.core.sse", imported="gateway.http.app")
    assert any({"gateway.core.sse", "gateway.http.app"} <= c for c in _cycles(graph))


def test_the_import_linter_contracts_are_kept() -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None
    done = subprocess.run(
        [exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "broken" not in done.stdout.lower().replace("0 broken", "")
