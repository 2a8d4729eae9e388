"""bundle-digest: model_bundle_sha256 of a model directory, by its written definition."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from gateway.tools.cli import main
from gateway.upstream.bundle import DEFINITION, BundleError, bundle_digest

FILES = {
    "config.json": b'{"architectures": ["Gemma3ForConditionalGeneration"]}',
    "tokenizer.json": b'{"model": {}}',
    "weights/model-00001.safetensors": bytes(range(256)) * 64,
    "weights/model-00002.safetensors": b"\x00" * 5000,
    ".hidden/notes": b"hidden files count too",
}


def _make(root: Path, files: dict[str, bytes], order: list[str] | None = None) -> Path:
    for name in order or list(files):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
    return root


def _by_hand(files: dict[str, bytes]) -> str:
    """The definition, step by step, without the module."""
    entries = [
        {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in sorted(files.items())
    ]
    text = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def test_digest_follows_the_written_definition(tmp_path: Path) -> None:
    bundle = bundle_digest(_make(tmp_path, FILES))
    assert bundle.sha256 == _by_hand(FILES)
    assert [f.path for f in bundle.files] == sorted(FILES)
    assert ".hidden/notes" in [f.path for f in bundle.files]


def test_deterministic_and_independent_of_creation_order(tmp_path: Path) -> None:
    one = _make(tmp_path / "one", FILES)
    two = _make(tmp_path / "two", FILES, order=list(reversed(FILES)))
    (two / "empty-dir").mkdir()  # empty directories add nothing
    os.utime(two / "config.json", (1, 1))  # nor do timestamps
    assert bundle_digest(one) == bundle_digest(one)
    assert bundle_digest(one).sha256 == bundle_digest(two).sha256


def test_any_byte_name_or_file_changes_it(tmp_path: Path) -> None:
    base = bundle_digest(_make(tmp_path / "base", FILES)).sha256
    flipped = dict(FILES)
    data = bytearray(FILES["weights/model-00002.safetensors"])
    data[4321] ^= 1
    flipped["weights/model-00002.safetensors"] = bytes(data)
    renamed = {("Config.json" if k == "config.json" else k): v for k, v in FILES.items()}
    moved = {("config.json.d/x" if k == "config.json" else k): v for k, v in FILES.items()}
    added = {**FILES, "extra": b""}
    digests = {base}
    for index, variant in enumerate((flipped, renamed, moved, added)):
        digest = bundle_digest(_make(tmp_path / f"v{index}", variant)).sha256
        assert digest == _by_hand(variant)
        digests.add(digest)
    assert len(digests) == 5


def test_symlinks_and_empty_directories_are_refused(tmp_path: Path) -> None:
    root = _make(tmp_path / "model", FILES)
    (root / "link").symlink_to(root / "config.json")
    with pytest.raises(BundleError, match="link: is a symlink"):
        bundle_digest(root)
    (root / "link").unlink()
    (root / "weights" / "dirlink").symlink_to(root / ".hidden")
    with pytest.raises(BundleError, match="weights/dirlink: is a symlink"):
        bundle_digest(root)
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(BundleError, match="holds no regular file"):
        bundle_digest(tmp_path / "empty")
    os.mkfifo(tmp_path / "empty" / "fifo")
    with pytest.raises(BundleError, match="fifo: is not a regular file"):
        bundle_digest(tmp_path / "empty")


def test_the_directory_itself_may_be_a_symlink(tmp_path: Path) -> None:
    root = _make(tmp_path / "model", FILES)
    (tmp_path / "current").symlink_to(root)
    assert bundle_digest(tmp_path / "current").sha256 == _by_hand(FILES)


def test_cli_prints_the_digest_or_the_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _make(tmp_path / "model", FILES)
    assert main(["bundle-digest", str(root)]) == 0
    assert capsys.readouterr().out == _by_hand(FILES) + "\n"
    assert main(["bundle-digest", str(root), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_bundle_sha256"] == _by_hand(FILES)
    assert [f["path"] for f in report["files"]] == sorted(FILES)
    assert report["files"][0].keys() == {"path", "sha256", "size"}
    assert main(["bundle-digest", str(tmp_path / "absent")]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_the_definition_is_in_the_help_and_the_deploy_doc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        main(["bundle-digest", "--help"])
    assert DEFINITION.splitlines()[4] in capsys.readouterr().out
    deploy = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    assert DEFINITION in deploy
