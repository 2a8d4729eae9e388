"""Which build of the hot core runs (gateway/native.py): proven in every run.

``make test`` runs the suite twice, once on the compiled build (where a C
compiler is) and once forced pure, and says which it expects through
``GATEWAY_EXPECT_BUILD``; the first test here fails when the modules come
from the other build. The rest check the mechanism itself: ``GATEWAY_PURE``
and a stale build both mean the ``.py`` files.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway import native

ROOT = Path(__file__).resolve().parents[1]


def test_the_expected_build_is_loaded() -> None:
    build, why = native.selected()
    expected = os.environ.get("GATEWAY_EXPECT_BUILD", build)
    assert (build, native.loaded_build()) == (expected, expected), why
    for name in native.COMPILED:
        module = importlib.import_module(name)
        path = str(module.__file__)
        if expected == "pure":
            assert path.endswith(".py"), path
        else:
            assert path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), path
    # a compiled function is a builtin, not a Python function
    sse = importlib.import_module("gateway.core.sse")
    assert type(sse.violation).__name__ == (
        "function" if expected == "pure" else "builtin_function_or_method"
    )
    assert ("gateway._native__mypyc" in sys.modules) == (expected == "mypyc")


def test_every_compiled_module_is_tested_on_both_builds() -> None:
    """``make test``'s pure pass runs the tests of every compiled module (the
    folder mirroring its package), so neither build goes untested."""
    line = next(
        line
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("PURE_TESTS :=")
    )
    pure = line.split(":=", 1)[1].split()
    for name in native.COMPILED:
        folder = "tests/" + "/".join(name.split(".")[1:-1])
        assert any(folder == t or folder.startswith(t + "/") for t in pure), name


def _probe(env: dict[str, str]) -> dict[str, str]:
    code = (
        "import json, gateway.core.sse as m, gateway.native as n; "
        "print(json.dumps({'file': m.__file__, 'build': n.selected()[0]}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, check=True
    ).stdout
    result: dict[str, str] = json.loads(out)
    return result


def test_gateway_pure_forces_the_python_modules() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_PURE"}
    assert _probe({**env, "GATEWAY_PURE": "1"}) == {
        "file": str(ROOT / "gateway" / "core" / "sse.py"),
        "build": "pure",
    }
    # GATEWAY_PURE=0 forces nothing: the build the stamp allows
    assert (
        _probe({**env, "GATEWAY_PURE": "0"})["build"] == native._stamp_build(native.STAMP, ROOT)[0]
    )


def _sources(root: Path) -> None:
    for path in native.source_paths(root):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {path.name}\n")


def test_a_build_loads_only_while_its_stamp_matches_the_sources(tmp_path: Path) -> None:
    _sources(tmp_path)
    stamp = tmp_path / "stamp.json"
    assert native._stamp_build(stamp, tmp_path) == ("pure", "not built")
    stamp.write_text("{not json")
    assert native._stamp_build(stamp, tmp_path) == ("pure", "unreadable build stamp")
    digest = native.digest(native.source_paths(tmp_path))
    stamp.write_text(json.dumps({"compiler": "mypyc", "digest": digest}))
    assert native._stamp_build(stamp, tmp_path) == ("mypyc", "built")
    # one module edited after the build: its extension would run old code
    native.source_paths(tmp_path)[3].write_text("# edited\n")
    assert native._stamp_build(stamp, tmp_path) == (
        "pure",
        "stale build (sources changed since)",
    )


def test_the_pure_finder_takes_the_py_beside_an_extension(tmp_path: Path) -> None:
    (tmp_path / "hot.py").write_text("VALUE = 1\n")
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / ("hot" + suffix)).write_bytes(b"not an extension")
    # Python's own finder prefers the extension module ...
    plain = importlib.machinery.PathFinder.find_spec("hot", [str(tmp_path)])
    assert plain is not None and str(plain.origin).endswith(suffix)
    # ... the pure finder the source, and only for the names it was given.
    finder = native.PureFinder(["hot"])
    spec = finder.find_spec("hot", [str(tmp_path)])
    assert spec is not None and spec.origin == str(tmp_path / "hot.py")
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)
    assert finder.find_spec("cold", [str(tmp_path)]) is None
    assert finder.find_spec("hot", None) is None


@pytest.mark.parametrize("value", ["1", "yes"])
def test_select_forces_pure_for_any_gateway_pure_but_0(value: str) -> None:
    saved = dict(native._selected)
    meta_path = list(sys.meta_path)
    native._selected.clear()
    try:
        assert native.select({"GATEWAY_PURE": value}) == ("pure", "GATEWAY_PURE is set")
        assert isinstance(sys.meta_path[0], native.PureFinder)
        # chosen once: a second call changes nothing
        assert native.select({}) == ("pure", "GATEWAY_PURE is set")
    finally:
        sys.meta_path[:] = meta_path
        native._selected.clear()
        native._selected.update(saved)
