"""The image and speech fixture generator: deterministic bytes, the engine's floor sizes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gateway.testing.engine import mediagen


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("kind", ["image", "speech"])
def test_same_inputs_give_byte_identical_fixtures_across_processes(kind: str) -> None:
    """The machine's cached fixture (made by whichever process came first) and a
    fresh one made by another process are the same bytes."""
    cached = mediagen.ensure_image() if kind == "image" else mediagen.ensure_speech()
    with tempfile.TemporaryDirectory(prefix="mediagen-") as fresh:
        started = time.monotonic()
        printed = subprocess.run(
            [sys.executable, "-m", "gateway.testing.engine", "generate", "--kind", kind,
             "--cache", fresh],
            check=True, capture_output=True, text=True, timeout=300,
        ).stdout.strip()  # fmt: skip
        took = time.monotonic() - started
        there = Path(printed)
        assert there == Path(fresh) / cached.root.name
        assert _digests(there) == _digests(cached.root)
    size = mediagen.fixture_bytes(cached.root)
    print(f"\n{kind} fixture: {size / 1e6:.1f} MB, generated in {took:.2f} s (process included)")


def test_the_image_fixture_is_a_flux_folder_and_a_planted_hub_cache() -> None:
    fixture = mediagen.ensure_image()
    names = sorted(str(p.relative_to(fixture.model_dir)) for p in fixture.model_dir.rglob("*.*"))
    assert names == [
        "ae.safetensors", "flux1-schnell.safetensors", "transformer/config.json",
        "vae/config.json",
    ]  # fmt: skip
    config = json.loads((fixture.model_dir / "transformer" / "config.json").read_text())
    assert (config["num_layers"], config["num_single_layers"]) == (0, 0)
    # The engine's fixed hidden size makes even a block-less transformer ~39 M parameters.
    transformer = (fixture.model_dir / "flux1-schnell.safetensors").stat().st_size
    assert 75_000_000 < transformer < 82_000_000
    for repo, name in [
        (mediagen.T5_TOKENIZER_REPO, "t5-v1_1-xxl.tokenizer.json"),
        (mediagen.T5_REPO, "t5_xxl-shard-1.safetensors"),
        (mediagen.CLIP_REPO, "tokenizer.json"),
    ]:
        base = fixture.hf_cache / ("models--" + repo.replace("/", "--"))
        revision = (base / "refs" / "main").read_text()
        assert (base / "snapshots" / revision / name).is_file()


def test_the_speech_fixture_holds_dia_and_the_engines_fixed_dac() -> None:
    fixture = mediagen.ensure_speech()
    config = json.loads((fixture.model_dir / "config.json").read_text())
    assert config["data"]["channels"] == mediagen.DAC_CODEBOOKS
    assert config["model"]["tgt_vocab_size"] > mediagen.DAC_CODEBOOK_SIZE
    dac = (fixture.dac_dir / "model.safetensors").stat().st_size
    assert 100_000_000 < dac < 115_000_000  # ~54 M parameters at f16: the engine's sizes
    assert (fixture.model_dir / "model.safetensors").stat().st_size < 5_000_000


def test_the_cache_is_keyed_by_the_spec_and_its_libraries() -> None:
    spec = mediagen.DiaSpec()
    assert mediagen.speech_dir().name == f"speech-{mediagen.digest('speech', spec)[:16]}"
    other = dataclasses.replace(spec, seed=spec.seed + 1)
    assert mediagen.digest("speech", other) != mediagen.digest("speech", spec)
    assert mediagen.digest("image", mediagen.FluxSpec()) != mediagen.digest("speech", spec)
