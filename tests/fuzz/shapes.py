"""Helpers the fuzz tests share: byte streams cut into pieces, paths into JSON."""

from __future__ import annotations

from typing import Any


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    """``data`` cut at the given piece sizes; what is left is the last piece."""
    pieces, at = [], 0
    for size in sizes:
        if at >= len(data):
            break
        pieces.append(data[at : at + size])
        at += size
    if at < len(data):
        pieces.append(data[at:])
    return pieces


def mutate(seed: bytes, edits: list[tuple[int, str, bytes]]) -> bytes:
    """``seed`` with each edit applied in turn at ``where`` (wrapped to the length):
    ``d`` delete, ``i`` insert, ``r`` overwrite with the blob, ``c`` copy a slice of
    the stream elsewhere (long lines, extra events)."""
    data = bytearray(seed)
    for where, op, blob in edits:
        at = where % (len(data) + 1)
        if op == "d":
            del data[at : at + max(1, len(blob))]
        elif op == "i":
            data[at:at] = blob
        elif op == "r":
            data[at : at + len(blob)] = blob
        else:
            start = (where * 7919) % (len(data) + 1)
            data[at:at] = data[start : start + 64 * (1 + len(blob))]
    return bytes(data)


def json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (keys and indexes), the root's included."""
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += json_paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            out += json_paths(value, (*prefix, index))
    return out
