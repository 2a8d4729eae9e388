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
