"""The README's layout block, one line per folder, from each package's docstring.

``python -m gateway.tools.layout`` prints it; ``tests/tools/test_layout.py``
fails while README.md says something else, so the block cannot drift from
the code: a folder's line is the first line of its ``__init__.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
#: the folders beside the package, which have no docstring of their own
OUTSIDE = (
    ("bench/", "benchmarks printing figures (bench/README.md)"),
    ("tests/", "mirrors gateway/; integration/ starts real processes on 127.0.0.1"),
    ("deploy/", "Kubernetes manifests, Redis for shared limits (docs/deploy.md)"),
    ("fixtures/", "SSE captures, media samples, keys and configs the tests replay"),
    ("policies/", "example tenant policies"),
    ("docs/", "the documents in the table above"),
)


def _summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    if not doc:
        raise ValueError(f"{path.relative_to(PACKAGE.parent)} has no docstring")
    return doc.splitlines()[0].rstrip(".")


def layout_lines() -> list[str]:
    folders = sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    rows = [(f"  {p.name}/", _summary(p / "__init__.py")) for p in folders]
    rows.append(("  types.py", _summary(PACKAGE / "types.py")))
    rows = [("gateway/", ""), *rows, *OUTSIDE]
    width = max(len(name) for name, _ in rows) + 2
    return [f"{name:<{width}}{text}".rstrip() for name, text in rows]


if __name__ == "__main__":
    print("\n".join(layout_lines()))
