"""Deterministic generator of random-weight Llama models (test equipment).

Theory of operation: a :class:`ModelSpec` (sizes, seed) plus the generator's
version and the versions of the libraries that shape the bytes (numpy's random
stream, tokenizers' trainer, safetensors' writer) are digested; the model lives
in ``<cache>/<size>-<digest>``. A folder that exists is complete: it is built
in a temporary sibling, fsynced and renamed into place, so a concurrent process
sees either nothing or the whole model (the loser of a rename race discards its
copy). The same inputs give byte-identical files.

What the folder holds, as a Hugging Face model folder would:
``config.json`` (``LlamaForCausalLM``), ``model.safetensors`` (float16 weights
drawn from seeded normal distributions: the model's text is the output of
random weights), ``tokenizer.json`` (a byte-level BPE trained with
``tokenizers`` on a corpus made here from a fixed text and seeded pseudo-words),
``tokenizer_config.json`` (a Jinja chat template for system/user/assistant
turns, bos/eos tokens) and ``generation_config.json``.

Every byte value has a byte-level token, so the token that decodes to U+0000
exists (:func:`nul_token_id`); :func:`eos_token_id` is the end-of-sequence
token (tests push either with ``logit_bias``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy
import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

GENERATOR_VERSION = 1
CACHE_ENV = "GATEWAY_ENGINE_CACHE"

BOS = "<s>"
EOS = "</s>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, *ROLE_TOKENS)

# One turn per message; unknown roles are refused while rendering.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_CORPUS_TEXT = """\
This model is test equipment. Its weights are random numbers drawn from a seeded
generator, so whatever it writes is the output of random weights and means nothing.
A gateway authenticates every caller, bounds every request, admits it, forwards it to
the worker on loopback and validates the stream of events that comes back: data
chunks, keep-alive comments, a final chunk with usage, and the done marker.
The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.
Numbers 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 65536, punctuation . , ; : ! ? ( ) [ ] { }
and quotes ' " ` sit beside tabs\tand new lines.
"""

_SYLLABLES = (
    "ka", "ri", "to", "mu", "sen", "da", "vel", "or", "an", "ith", "el", "mo", "ra", "qui",
    "zen", "po", "lu", "fa", "ne", "sti", "gra", "bo", "cha", "de", "xi", "yu", "wa", "tor",
    "mis", "ul", "eb", "on", "ax", "ir", "um",
)  # fmt: skip


@dataclass(frozen=True)
class ModelSpec:
    """What is generated: a Llama's shape, the tokenizer's size and the seed."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_position_embeddings: int
    corpus_words: int
    seed: int = 20260822

    def digest(self) -> str:
        """SHA-256 of the spec, the generator (version, corpus, template) and its libraries."""
        identity = {
            "generator": GENERATOR_VERSION,
            "corpus": hashlib.sha256("\n".join((_CORPUS_TEXT, *_SYLLABLES)).encode()).hexdigest(),
            "chat_template": CHAT_TEMPLATE,
            "spec": dataclasses.asdict(self),
            "numpy": np.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
        }
        encoded = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(encoded).hexdigest()


SIZES: dict[str, ModelSpec] = {
    # ~0.2M parameters, ~0.5 MB: loads in well under a second.
    "tiny": ModelSpec(
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        vocab_size=512,
        max_position_embeddings=512,
        corpus_words=4_000,
    ),
    # ~25M parameters (~50 MB): slow enough to watch decoding and its CPU.
    "small": ModelSpec(
        hidden_size=512,
        intermediate_size=1408,
        num_layers=7,
        num_heads=8,
        num_kv_heads=4,
        vocab_size=4096,
        max_position_embeddings=2048,
        corpus_words=40_000,
    ),
}


def cache_root(cache: str | os.PathLike[str] | None = None) -> Path:
    """The models' folder: ``cache``, else ``$GATEWAY_ENGINE_CACHE``, else the user cache."""
    if cache is not None:
        return Path(cache)
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mistralrs-gateway" / "models"


def model_dir(size: str, cache: str | os.PathLike[str] | None = None) -> Path:
    """Where the model of ``size`` lives (whether or not it was generated yet)."""
    return cache_root(cache) / f"{size}-{_spec(size).digest()[:16]}"


def ensure_model(size: str = "tiny", cache: str | os.PathLike[str] | None = None) -> Path:
    """The model folder of ``size``, generated first if the cache does not hold it."""
    return build_once(model_dir(size, cache), lambda staging: write_model(_spec(size), staging))


def build_once(final: Path, write: Callable[[Path], None]) -> Path:
    """``final``, built by ``write(staging)`` first if it does not exist: in a
    temporary sibling, renamed into place (a concurrent builder's identical
    copy may win the rename; a folder that exists is complete)."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        staging.chmod(0o755)  # mkdtemp made it private; the fixture is for any reader
        write(staging)
        try:
            staging.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            # Another process renamed its identical copy first.
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    fsync_path(final.parent)
    return final


def write_model(spec: ModelSpec, folder: Path) -> None:
    """Write every file of the model described by ``spec`` into ``folder`` (fsynced)."""
    folder.chmod(0o755)
    tokenizer = _train_tokenizer(spec)
    bos_id, eos_id = _token_id(tokenizer, BOS), _token_id(tokenizer, EOS)
    _write_json(folder / "config.json", _config(spec, bos_id, eos_id))
    weights = folder / "model.safetensors"
    safetensors.numpy.save_file(_weights(spec), str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    fsync_path(weights)
    tokenizer_path = folder / "tokenizer.json"
    tokenizer_path.write_text(tokenizer.to_str(pretty=False), encoding="utf-8")
    fsync_path(tokenizer_path)
    _write_json(
        folder / "tokenizer_config.json",
        {
            "add_bos_token": False,
            "add_eos_token": False,
            "bos_token": BOS,
            "chat_template": CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "eos_token": EOS,
            "model_max_length": spec.max_position_embeddings,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
    )
    _write_json(
        folder / "generation_config.json",
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "_note": "random weights"},
    )
    fsync_path(folder)


def nul_token_id(folder: str | os.PathLike[str]) -> int:
    """The id of the byte-level token that decodes to U+0000."""
    return byte_token_id(folder, 0)


def byte_token_id(folder: str | os.PathLike[str], byte: int) -> int:
    """The id of the byte-level token for one byte (below 0x80: decodes to that character)."""
    tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    found = _token_id(tokenizer, _byte_level_char(byte))
    if byte < 0x80 and tokenizer.decode([found]) != chr(byte):
        raise ValueError(f"token {found} does not decode to byte {byte:#x}")
    return found


def eos_token_id(folder: str | os.PathLike[str]) -> int:
    """The id of the end-of-sequence token."""
    config = json.loads((Path(folder) / "generation_config.json").read_text(encoding="utf-8"))
    value = config["eos_token_id"]
    if not isinstance(value, int):
        raise ValueError("generation_config.json: eos_token_id is not an integer")
    return value


def parameter_count(spec: ModelSpec) -> int:
    """How many weights the model of ``spec`` has."""
    return sum(int(np.prod(shape)) for shape in _shapes(spec).values())


# -- internals


def _spec(size: str) -> ModelSpec:
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r} (known: {', '.join(SIZES)})") from None


def _corpus(spec: ModelSpec) -> list[str]:
    rng = np.random.default_rng(spec.seed)
    lines = _CORPUS_TEXT.splitlines()
    words: list[str] = []
    for _ in range(spec.corpus_words):
        count = int(rng.integers(1, 4))
        picks = rng.integers(0, len(_SYLLABLES), size=count)
        words.append("".join(_SYLLABLES[int(i)] for i in picks))
        if len(words) == 12:
            lines.append(" ".join(words))
            words = []
    lines.append(" ".join(words))
    return lines


def _train_tokenizer(spec: ModelSpec) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec), trainer)
    if tokenizer.get_vocab_size() > spec.vocab_size:
        raise ValueError("the trained vocabulary is larger than the model's")
    return tokenizer


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(f"token {token!r} is not in the vocabulary")
    return int(found)


def _byte_level_char(byte: int) -> str:
    """The character GPT-2's byte-level alphabet uses for ``byte``."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    if byte in printable:
        return chr(byte)
    others = [b for b in range(256) if b not in printable]
    return chr(256 + others.index(byte))


def _config(spec: ModelSpec, bos_id: int, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float16",
    }


def _shapes(spec: ModelSpec) -> dict[str, tuple[int, int] | tuple[int]]:
    hidden, inter = spec.hidden_size, spec.intermediate_size
    head_dim = hidden // spec.num_heads
    kv = spec.num_kv_heads * head_dim
    shapes: dict[str, tuple[int, int] | tuple[int]] = {
        "model.embed_tokens.weight": (spec.vocab_size, hidden),
    }
    for layer in range(spec.num_layers):
        prefix = f"model.layers.{layer}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (hidden, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (kv, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (kv, hidden)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, hidden)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (spec.vocab_size, hidden)
    return shapes


def _weights(spec: ModelSpec) -> dict[str, np.ndarray[Any, np.dtype[np.float16]]]:
    rng = np.random.default_rng(spec.seed)
    tensors: dict[str, np.ndarray[Any, np.dtype[np.float16]]] = {}
    for name, shape in _shapes(spec).items():
        if len(shape) == 1:
            tensors[name] = np.ones(shape, dtype=np.float16)  # RMSNorm scales
        else:
            drawn = rng.standard_normal(shape, dtype=np.float32) * 0.02
            tensors[name] = drawn.astype(np.float16)
    return tensors


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    fsync_path(path)


def fsync_path(path: Path) -> None:
    """fsync a file or a folder."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
