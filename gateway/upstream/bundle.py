"""``model_bundle_sha256``: the digest of a model directory, defined exactly.

``mistralrs-gateway bundle-digest DIR`` computes it; ``upstream.launch``
pins it (spec §11) and ``model_dir`` ends with it. The definition is
:data:`DEFINITION` (also the verb's help and ``docs/deploy.md``); anyone can
recompute it with a few lines in any language.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFINITION = """\
model_bundle_sha256 (bundle digest v1) of a directory DIR:

1. Walk DIR recursively. DIR itself may be a symlink to a directory; below it
   every regular file is included, hidden ones (names starting with ".")
   too; directories are walked (an empty one adds nothing); a symlink (to
   anything) or any other file type (FIFO, socket, device) is refused and no
   digest is printed. A directory with no regular file is refused.
2. Each file is one entry: "path", its path relative to DIR with "/" between
   the parts (the name as UTF-8; a name that is not valid UTF-8 is refused);
   "size", its length in bytes; "sha256", the SHA-256 of its content as 64
   lowercase hex digits.
3. The entries are sorted by path (Unicode code point order, which is the
   byte order of UTF-8).
4. The manifest is the JSON array of the entries serialized as Python's
   json.dumps(entries, sort_keys=True, separators=(",", ":"),
   ensure_ascii=True) would, e.g.
   [{"path":"config.json","sha256":"<64 hex>","size":1234},...]
5. The digest is the SHA-256 of the manifest's bytes, as 64 lowercase hex.

Permissions, owners and timestamps are not covered; file contents and names are.
"""

_PIECE = 1 << 20


class BundleError(Exception):
    """The directory cannot be digested; the text names a relative path, never content."""


@dataclass(frozen=True, slots=True)
class BundleFile:
    path: str
    size: int
    sha256: str

    def entry(self) -> dict[str, object]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True, slots=True)
class Bundle:
    sha256: str
    files: tuple[BundleFile, ...]


def manifest(files: list[BundleFile] | tuple[BundleFile, ...]) -> bytes:
    """The canonical manifest bytes (step 4) of entries already sorted (step 3)."""
    entries = [f.entry() for f in files]
    return json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def bundle_digest(directory: Path) -> Bundle:
    """Digest ``directory`` by :data:`DEFINITION`; BundleError when it cannot be."""
    if not directory.is_dir():
        raise BundleError(f"{directory}: not a directory")
    files = sorted(_walk(directory, ""), key=lambda f: f.path)
    if not files:
        raise BundleError(f"{directory}: holds no regular file")
    return Bundle(hashlib.sha256(manifest(files)).hexdigest(), tuple(files))


def _walk(root: Path, relative: str) -> list[BundleFile]:
    found: list[BundleFile] = []
    here = root / relative if relative else root
    try:
        entries = sorted(os.scandir(here), key=lambda e: e.name)
    except OSError as exc:
        raise BundleError(f"{relative or '.'}: cannot be listed ({type(exc).__name__})") from exc
    for entry in entries:
        path = f"{relative}/{entry.name}" if relative else entry.name
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise BundleError(f"{path!r}: the name is not valid UTF-8") from None
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISLNK(mode):
            raise BundleError(f"{path}: is a symlink (refused: the digest covers files only)")
        if stat.S_ISDIR(mode):
            found += _walk(root, path)
        elif stat.S_ISREG(mode):
            found.append(_file(root / path, path))
        else:
            raise BundleError(f"{path}: is not a regular file or a directory")
    return found


def _file(full: Path, path: str) -> BundleFile:
    digest = hashlib.sha256()
    size = 0
    try:
        with full.open("rb") as fh:
            while piece := fh.read(_PIECE):
                digest.update(piece)
                size += len(piece)
    except OSError as exc:
        raise BundleError(f"{path}: cannot read ({type(exc).__name__})") from exc
    return BundleFile(path, size, digest.hexdigest())
