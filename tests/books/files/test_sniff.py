"""The file sniffer: a produced file's type from its bytes alone (spec §22 "Files")."""

from __future__ import annotations

import gzip
import io
import zipfile

import pytest

from gateway.books.files.sniff import (
    BINARY,
    FILE_EXTENSIONS,
    FILE_TYPES,
    GZIP,
    PDF,
    TEXT,
    ZIP,
    content_type,
    sniff_file,
)
from gateway.testing.samples import build_mp4, build_png, build_wav
from tests.books.evidence.support import fixture_bytes


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("a.txt", "hello")
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "mime", "ext"),
    [
        (build_png(), "image/png", "png"),
        (fixture_bytes("tiny.png"), "image/png", "png"),
        (b"\xff\xd8\xff\xe0" + b"\0" * 20, "image/jpeg", "jpg"),
        (b"GIF89a" + b"\0" * 20, "image/gif", "gif"),
        (b"RIFF\x10\0\0\0WEBPVP8 " + b"\0" * 8, "image/webp", "webp"),
        (build_wav(), "audio/wav", "wav"),
        (b"ID3\x04\0\0\0\0\0\0" + b"\0" * 8, "audio/mpeg", "mp3"),
        (build_mp4(), "video/mp4", "mp4"),
        (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", "application/pdf", "pdf"),
        (_zip(), "application/zip", "zip"),
        (b"PK\x05\x06" + b"\0" * 18, "application/zip", "zip"),
        (gzip.compress(b"hello"), "application/gzip", "gz"),
        (b"a,b\n1,2\r\n", "text/plain", "txt"),
        (b'{"city": "Paris"}', "text/plain", "txt"),
        ("na\u00efve \u2603 text\twith tabs\f".encode(), "text/plain", "txt"),
        (b"", "text/plain", "txt"),
        (b"\x00\x01\x02binary", "application/octet-stream", "bin"),
        (b"text with a NUL\x00", "application/octet-stream", "bin"),
        (b"\xc3\x28 not utf-8", "application/octet-stream", "bin"),
        (b"\x1b[31mansi\x1b[0m", "application/octet-stream", "bin"),
    ],
)
def test_the_type_comes_from_the_bytes(data: bytes, mime: str, ext: str) -> None:
    found = sniff_file(data)
    assert (found.mime, found.ext) == (mime, ext)
    assert found.mime in FILE_TYPES and found.ext in FILE_EXTENSIONS


@pytest.mark.parametrize(
    "data",
    [
        b"<!doctype html><script>alert(document.cookie)</script>",
        b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"/>',
        b'<?xml version="1.0"?><x/>',
        b"#!/bin/sh\nrm -rf /\n",
    ],
)
def test_documents_a_browser_would_run_are_plain_text(data: bytes) -> None:
    """Whatever a model names them, HTML and SVG are never served as documents."""
    assert sniff_file(data) == TEXT


def test_text_is_served_with_its_charset_and_nothing_else_gains_one() -> None:
    assert content_type(TEXT.mime) == "text/plain; charset=utf-8"
    for kind in (PDF, ZIP, GZIP, BINARY):
        assert content_type(kind.mime) == kind.mime
    assert content_type("image/png") == "image/png"


def test_every_extension_is_a_plain_lowercase_word() -> None:
    """A blob is named ``<sha256>.<ext>``: the store's name pattern takes these."""
    assert {"png", "jpg", "pdf", "zip", "txt", "bin", "wav", "mp4"} <= FILE_EXTENSIONS
    assert all(e.isalnum() and e.islower() and len(e) <= 8 for e in FILE_EXTENSIONS)
