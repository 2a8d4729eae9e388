"""Which build of the hot pure core runs: compiled (mypyc) or pure Python.

The modules in :data:`COMPILED` are the per-chunk path (SSE framing, the
stream grammars and dialects, the ids and usage they touch) and the pure
per-request steps a chat takes (its field checks and planner, the body
layout, the limits' and admission's cores). A compiled function checks its
annotated argument types at its boundary: a caller's value of a type an
annotation did not foresee would be a ``TypeError`` (a 500) where the pure
module answers a 400, so the planners take ``Any`` until they have checked a
value, and ``tests/fuzz/test_plan_types.py`` puts every JSON type at every
place of a full request of each descriptor, on both builds. ``make setup``
compiles them in place with mypyc when a C compiler is present
(``gateway/tools/build_native.py``): each gets an extension module beside its
``.py``, which Python's importer prefers, and the build writes
:data:`STAMP`, the digest of the sources it compiled.

The ``.py`` files stay the fallback, and the same tests run against both
builds (``make test``). :func:`select` runs once, when ``gateway`` is first
imported, and puts :class:`PureFinder` first on ``sys.meta_path`` -- so the
``.py`` of every compiled module is imported, whatever sits beside it --
when any of these holds:

- ``GATEWAY_PURE`` is set to anything but ``""`` or ``0`` (forcing pure);
- there is no stamp (never built, a build that failed half-way, no compiler);
- the stamp's digest is not the sources' (a module was edited since the
  build: a stale extension is never run in its place).

Nothing here is imported by the core itself; it reads files once, at import.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED", "STAMP", "PureFinder", "digest", "loaded_build", "select", "selected"]

#: the modules compiled, in dependency order (pure, ``mypy --strict``, no I/O);
#: the per-chunk core first, then the per-request steps (issue 35: -5 % of a
#: streamed chat's instructions)
COMPILED = (
    "gateway.core.sse",
    "gateway.apis.usage",
    "gateway.apis.ids",
    "gateway.apis.base",
    "gateway.apis.chat.plain",
    "gateway.apis.chat.grammar",
    "gateway.apis.chat.answer",
    "gateway.apis.chat.agentic",
    "gateway.apis.chat.dialect",
    "gateway.apis.responses.events",
    "gateway.apis.messages.events",
    "gateway.admission.core",
    "gateway.ratelimit.core",
    "gateway.core.body",
    "gateway.apis.fields",
    "gateway.apis.sampling",
    "gateway.apis.chat.api",
)

_ROOT = Path(__file__).resolve().parent.parent
#: written by the build after its last extension: ``{"compiler", "digest"}``
STAMP = Path(__file__).resolve().parent / "_native.json"

#: why the build in use was chosen (set by :func:`select`)
_selected: dict[str, str] = {}


def source_paths(root: Path = _ROOT) -> list[Path]:
    return [root / (name.replace(".", "/") + ".py") for name in COMPILED]


def digest(paths: Sequence[Path]) -> str:
    """SHA-256 over the sources (name and content of each, in order)."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


class PureFinder(importlib.abc.MetaPathFinder):
    """Imports the ``.py`` of ``names`` even where an extension module sits
    beside it (and never the compiled build's shared library)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = frozenset(names)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names or not path:
            return None
        loaders = [(importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES)]
        for entry in path:
            spec = importlib.machinery.FileFinder(entry, *loaders).find_spec(fullname)
            if spec is not None:
                return spec
        return None


def _stamp_build(stamp: Path, root: Path) -> tuple[str, str]:
    """(build, why): the stamp's compiler when its digest is the sources', else pure."""
    try:
        recorded = json.loads(stamp.read_text())
    except FileNotFoundError:
        return "pure", "not built"
    except (OSError, ValueError):
        return "pure", "unreadable build stamp"
    if not isinstance(recorded, dict) or recorded.get("digest") != digest(source_paths(root)):
        return "pure", "stale build (sources changed since)"
    return str(recorded.get("compiler", "pure")), "built"


def select(
    environ: Mapping[str, str] | None = None,
    stamp: Path = STAMP,
    root: Path = _ROOT,
) -> tuple[str, str]:
    """Choose the build once (``gateway/__init__.py`` calls this); (build, why)."""
    if _selected:
        return _selected["build"], _selected["why"]
    env = os.environ if environ is None else environ
    if env.get("GATEWAY_PURE", "") not in ("", "0"):
        build, why = "pure", "GATEWAY_PURE is set"
    else:
        build, why = _stamp_build(stamp, root)
    if build == "pure":
        sys.meta_path.insert(0, PureFinder(COMPILED))
    _selected.update(build=build, why=why)
    return build, why


def selected() -> tuple[str, str]:
    """(build, why) as :func:`select` chose them."""
    return _selected.get("build", "pure"), _selected.get("why", "not selected")


def loaded_build() -> str:
    """What the compiled modules were actually imported from (imports them):
    ``pure`` when every one is a ``.py``, else the stamp's compiler; a mix
    is an error."""
    import importlib

    kinds = {not str(importlib.import_module(name).__file__).endswith(".py") for name in COMPILED}
    if kinds == {False}:
        return "pure"
    if kinds == {True}:
        return selected()[0]
    raise RuntimeError("the compiled modules were imported from both builds")
