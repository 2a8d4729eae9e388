"""The pure core imports no I/O library (style: "a pure core").

import-linter checks the import statements (``make lint``); this checks what
importing them really loads, in a fresh interpreter, so that nothing else in
the test run has loaded those libraries already. The modules and the
libraries are the ones the forbidden contract in ``pyproject.toml`` names:
one list, not a second hand-kept copy.
"""

from __future__ import annotations

import pkgutil
import tomllib
from importlib import import_module
from pathlib import Path
from typing import Any

from tests.support.imports import top_level_imports

ROOT = Path(__file__).resolve().parents[2]


def _pure_contract() -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (pure,) = [
        c for c in contracts if c["type"] == "forbidden" and "gateway.core" in c["source_modules"]
    ]
    return dict(pure)


def _modules(names: list[str]) -> list[str]:
    """Each named module, and every module under a named package."""
    found: list[str] = []
    for name in names:
        found.append(name)
        module = import_module(name)
        if hasattr(module, "__path__"):
            found += [m.name for m in pkgutil.walk_packages(module.__path__, name + ".")]
    return found


def test_the_contract_covers_the_whole_core_folder() -> None:
    modules = _modules(_pure_contract()["source_modules"])
    on_disk = {
        "gateway.core." + p.stem
        for p in (ROOT / "gateway" / "core").glob("*.py")
        if p.stem != "__init__"
    }
    assert on_disk and on_disk <= set(modules)


def test_pure_modules_import_no_io_library() -> None:
    contract = _pure_contract()
    modules = _modules(contract["source_modules"])
    loaded = top_level_imports(modules)
    assert "gateway" in loaded
    assert loaded & set(contract["forbidden_modules"]) == set()
