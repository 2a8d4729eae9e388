"""The model generator: deterministic bytes, a digest-keyed atomic cache, the NUL token."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import mistralrs
import pytest
from tokenizers import Tokenizer

from gateway.testing.engine import modelgen
from gateway.testing.engine.engine import Engine

FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
]


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_same_inputs_give_byte_identical_files_across_processes(tmp_path: Path) -> None:
    here = modelgen.ensure_model("tiny", tmp_path / "a")
    command = [sys.executable, "-m", "gateway.testing.engine", "generate", "--size", "tiny"]
    printed = subprocess.run(
        [*command, "--cache", str(tmp_path / "b")],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    there = Path(printed)
    assert there == tmp_path / "b" / here.name
    assert sorted(_files(here)) == FILES
    assert _files(here) == _files(there)


def test_the_cache_is_keyed_by_the_digest_and_reused(tmp_path: Path) -> None:
    first = modelgen.ensure_model("tiny", tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = modelgen.ensure_model("tiny", tmp_path)
    assert again == first
    assert (again / "model.safetensors").stat().st_mtime_ns == stamp  # not rewritten
    spec = modelgen.SIZES["tiny"]
    assert first.name == f"tiny-{spec.digest()[:16]}"
    assert dataclasses.replace(spec, seed=spec.seed + 1).digest() != spec.digest()
    # Nothing but the model is left behind (the staging folder was renamed away).
    assert [p.name for p in tmp_path.iterdir()] == [first.name]


def test_the_cache_folder_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(modelgen.CACHE_ENV, str(tmp_path / "env"))
    assert modelgen.model_dir("tiny").parent == tmp_path / "env"
    monkeypatch.delenv(modelgen.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert modelgen.model_dir("small").parent == tmp_path / "xdg" / "mistralrs-gateway" / "models"


def test_a_finished_model_from_a_concurrent_writer_wins(tmp_path: Path) -> None:
    # The other process renamed its copy first: ours is discarded, theirs is used.
    final = modelgen.model_dir("tiny", tmp_path)
    final.mkdir(parents=True)
    (final / "marker").write_text("theirs")
    assert modelgen.ensure_model("tiny", tmp_path) == final
    assert (final / "marker").read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_the_vocabulary_has_the_nul_byte_token_and_an_eos(tmp_path: Path) -> None:
    folder = modelgen.ensure_model("tiny", tmp_path)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    nul = modelgen.nul_token_id(folder)
    assert tokenizer.decode([nul]) == "\x00"
    assert tokenizer.encode("\x00").ids == [nul]
    eos = modelgen.eos_token_id(folder)
    assert tokenizer.id_to_token(eos) == modelgen.EOS
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["eos_token"] == modelgen.EOS
    assert config["bos_token"] == modelgen.BOS


def test_the_config_describes_the_weights(tmp_path: Path) -> None:
    folder = modelgen.ensure_model("tiny", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    spec = modelgen.SIZES["tiny"]
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 2)
    # float16 weights: two bytes each, plus the safetensors header.
    weights = (folder / "model.safetensors").stat().st_size
    assert 2 * modelgen.parameter_count(spec) < weights < 2 * modelgen.parameter_count(spec) + 65536
    assert 20_000_000 < modelgen.parameter_count(modelgen.SIZES["small"]) < 30_000_000


def test_an_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model size"):
        modelgen.ensure_model("huge", tmp_path)


async def test_the_tiny_model_loads_in_the_engine_and_generates(tmp_path: Path) -> None:
    folder = modelgen.ensure_model("tiny", tmp_path)
    engine = Engine(folder, threads=2)
    try:
        assert engine.statuses() == [(str(folder), "loaded")]
        request = mistralrs.ChatCompletionRequest(
            messages=[{"role": "user", "content": "hi"}], model="default", max_tokens=4
        )
        answer = await engine.chat(request)
        assert answer.model == str(folder)
        assert answer.usage.completion_tokens == 4
        assert answer.choices[0].finish_reason == "length"
    finally:
        engine.close()
