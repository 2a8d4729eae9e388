"""Compile the hot pure core in place (``make setup``); see ``gateway/native.py``.

Run: ``.venv/bin/python -m gateway.tools.build_native``. With a C compiler
and Python's headers present it compiles :data:`gateway.native.COMPILED`
with mypyc (the kept toolchain: ``bench/README.md``, issue 35) into
extension modules beside their ``.py`` files, then writes the stamp that
lets ``gateway`` load them. Without a compiler it prints one line and the
gateway runs its pure-Python modules. A build whose stamp matches the
sources does nothing (a second ``make setup`` costs one import).

``--compiler cython`` builds the comparison candidate instead (the same
``.py`` files compiled by Cython; needs ``pip install cython``);
``--clean`` removes every build; ``--expect`` prints the build ``make test``
expects here (``mypyc`` or ``pure``); ``--which`` the build selected and why.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from gateway import native

ROOT = Path(__file__).resolve().parent.parent.parent
BUILD_DIR = ROOT / "build" / "native"
#: the shared library of a mypyc build of several modules (``gateway/_native__mypyc*.so``)
GROUP = "gateway._native"


def compiler_missing() -> str | None:
    """Why nothing can be compiled here, or None."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        return f"no Python headers ({include}/Python.h)"
    return None


def _extensions(root: Path) -> list[Path]:
    """Every extension module in the package's tree. Not only those of
    :data:`gateway.native.COMPILED`: one left by a build of a longer list would
    be imported in place of its ``.py`` and fail (its code is in no library)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(path for path in (root / "gateway").rglob("*.*") if path.name.endswith(suffixes))


def clean(root: Path = ROOT) -> None:
    native.STAMP.unlink(missing_ok=True)
    for path in _extensions(root):
        path.unlink()


def up_to_date(compiler: str) -> bool:
    try:
        recorded = json.loads(native.STAMP.read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(recorded, dict)
        and recorded.get("compiler") == compiler
        and recorded.get("digest") == native.digest(native.source_paths(ROOT))
        and bool(_extensions(ROOT))
    )


def _mypyc_extensions(paths: list[str]) -> list[Any]:
    from mypyc.build import mypycify

    return list(
        mypycify(paths, opt_level="3", group_name=GROUP, target_dir=str(BUILD_DIR / "mypyc"))
    )


def _cython_extensions(paths: list[str]) -> list[Any]:
    from Cython.Build import cythonize as untyped

    cythonize: Any = untyped  # Cython has no type hints
    return list(
        cythonize(
            paths,
            build_dir=str(BUILD_DIR / "cython"),
            compiler_directives={"language_level": "3"},
            quiet=True,
        )
    )


def _quiet_distutils() -> None:
    import logging

    logging.getLogger("distutils").setLevel(logging.WARNING)
    try:
        from distutils import log  # setuptools' copy on Python >= 3.12

        log.set_verbosity(0)
    except ImportError:
        pass


def build(compiler: str) -> None:
    """Compile in place, then write the stamp (a failed build leaves none)."""
    clean()
    sources = native.source_paths(ROOT)
    paths = [str(path.relative_to(ROOT)) for path in sources]
    before = native.digest(sources)
    started = time.monotonic()
    cwd = Path.cwd()
    os.chdir(ROOT)  # the compilers name modules by their paths from the root
    try:
        from setuptools import Distribution

        make = _mypyc_extensions if compiler == "mypyc" else _cython_extensions
        dist = Distribution({"name": "mistralrs-gateway-native", "ext_modules": make(paths)})
        dist.verbose = False  # the compiler's command lines: only its errors are news
        _quiet_distutils()
        command: Any = dist.get_command_obj("build_ext")
        command.inplace = True
        # Each compiler its own folders, and everything compiled anew: an object
        # or library left by the other (or older than its source) is never reused.
        command.build_temp = str(BUILD_DIR / compiler / "temp")
        command.build_lib = str(BUILD_DIR / compiler / "lib")
        command.force = True
        command.parallel = os.cpu_count() or 1
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    if native.digest(sources) != before:
        raise SystemExit("native: the sources changed during the build; run it again")
    stamp = {"compiler": compiler, "digest": before, "python": sys.version.split()[0]}
    native.STAMP.write_text(json.dumps(stamp) + "\n")
    print(
        f"native: compiled {len(sources)} modules with {compiler} "
        f"in {time.monotonic() - started:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--compiler", choices=("mypyc", "cython"), default="mypyc")
    parser.add_argument("--clean", action="store_true", help="remove every build")
    parser.add_argument("--expect", action="store_true", help="print the build make test expects")
    parser.add_argument("--which", action="store_true", help="print the build selected and why")
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    missing = compiler_missing()
    if args.expect:
        print("pure" if missing else args.compiler)
        return 0
    if args.which:
        print(*native.selected())
        return 0
    if args.clean:
        clean()
        return 0
    if missing is not None:
        print(f"native: {missing}: the gateway runs its pure-Python modules")
        return 0
    if args.force or not up_to_date(args.compiler):
        build(args.compiler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
