"""Deterministic generator of tiny random-weight image and speech models (test equipment).

Theory of operation: as ``modelgen.py`` for the chat model. A spec (sizes,
seed), this generator's version and the versions of the libraries that shape
the bytes are digested; the fixture lives in ``<cache>/<kind>-<digest>`` next
to the chat models (``modelgen.cache_root``), built in a temporary sibling
and renamed into place, so it is generated once per machine and the same
inputs give byte-identical files. Every weight is drawn from a seeded normal
distribution: what the models make is the output of random weights.

**Image: FLUX.1 schnell layout** (``Which.DiffusionPlain``, ``Flux``).
``<fixture>/flux`` is the model folder (the route): the transformer
``flux1-schnell.safetensors`` (BFL tensor names), the autoencoder
``ae.safetensors``, ``transformer/config.json`` and ``vae/config.json``. The
engine fixes the transformer's hidden size at 3072 (``flux/model.rs``), so
even with no double and no single block it has about 39 M parameters (78 MB
at f16): the fixture's size is the engine's floor, not a choice. The engine
also reads its T5 and CLIP text encoders and their tokenizers from three
Hugging Face repositories it names itself (``EricB/t5_tokenizer``,
``EricB/t5-v1_1-xxl-enc-only``, ``openai/clip-vit-large-patch14``): the
fixture plants tiny random ones of its own, under those names, in a hub
cache at ``<fixture>/hf-cache``, which the adapter reads with
``HF_HUB_OFFLINE=1`` and ``HF_HUB_CACHE`` pointing there. Nothing is
downloaded; the configs and 64-word tokenizers are ours, not the real ones.
With 4 VAE levels, an image is exactly the requested height by width
(multiples of 16).

**Speech: Dia + DAC** (``Which.Speech``, ``Dia``). ``<fixture>/dia`` holds
the Dia model (``config.json``, ``model.safetensors``: 32-wide, one encoder
and one decoder layer; text is read as bytes, no tokenizer) and
``<fixture>/dac`` the DAC codec (``model.safetensors``). The engine fixes the
DAC's sizes (9 codebooks of 1024, latent 1024, decoder 1536 channels, rates
8, 8, 4, 2: about 54 M parameters, 109 MB at f16), so that is its floor too.
``audio_length`` 20 frames give 2,048 samples at 44.1 kHz mono (46 ms): the
real delay pattern holds back 16 frames and each other one is 512 samples;
the DAC's cost grows with them, and a call costs ~1.7 s on two busy cores.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy
import tokenizers
from tokenizers import Tokenizer, models, pre_tokenizers

from gateway.testing.engine.modelgen import build_once, cache_root, fsync_path

MEDIA_GENERATOR_VERSION = 1
#: the engine's fixed FLUX sizes (``flux/model.rs``: hidden 3072, MLP ratio 4,
#: 24 heads of 128 = the rope axes 16 + 56 + 56; 16 latent channels packed 2 by 2)
FLUX_HIDDEN = 3072
FLUX_HEADS = 24
FLUX_IN_CHANNELS = 64
#: the DAC the engine builds for Dia (``dac::Config::dia``)
DAC_CODEBOOKS, DAC_CODEBOOK_SIZE, DAC_CODEBOOK_DIM, DAC_LATENT = 9, 1024, 8, 1024
DAC_CHANNELS, DAC_RATES = 1536, (8, 8, 4, 2)
#: the hub repositories the engine's FLUX pipeline reads (``flux/stepper.rs``)
T5_TOKENIZER_REPO = "EricB/t5_tokenizer"
T5_REPO = "EricB/t5-v1_1-xxl-enc-only"
CLIP_REPO = "openai/clip-vit-large-patch14"
_WORDS = (
    "a", "photo", "of", "the", "cat", "dog", "red", "blue", "green", "sky", "sea", "tree",
    "house", "car", "small", "big", "random", "weights", "test", "equipment", "hello", "world",
    "sound", "speech", "image", "picture", "and", "on", "in",
)  # fmt: skip
_SNAPSHOT = "0" * 40

Tensors = dict[str, np.ndarray[Any, Any]]


@dataclass(frozen=True)
class FluxSpec:
    """The image fixture: FLUX block counts, the tiny text encoders, the VAE."""

    double_blocks: int = 0
    single_blocks: int = 0
    text_width: int = 32  # T5 d_model and CLIP projection_dim
    vae_channels: int = 8
    seed: int = 20260823


@dataclass(frozen=True)
class DiaSpec:
    """The speech fixture: Dia's sizes and frames (the DAC's are the engine's)."""

    width: int = 32
    #: decoder frames; the delay pattern holds back 16, each other one is 512
    #: samples: 20 give 2,048 samples (46 ms), ~1.7 s on 2 busy cores
    audio_length: int = 20
    seed: int = 20260824


@dataclass(frozen=True)
class ImageFixture:
    root: Path

    @property
    def model_dir(self) -> Path:
        """The FLUX folder: ``Which.DiffusionPlain(model_id=…)`` and the route."""
        return self.root / "flux"

    @property
    def hf_cache(self) -> Path:
        """The planted hub cache (``HF_HUB_CACHE``) with the text encoders."""
        return self.root / "hf-cache"


@dataclass(frozen=True)
class SpeechFixture:
    root: Path

    @property
    def model_dir(self) -> Path:
        """The Dia folder: ``Which.Speech(model_id=…)`` and the route."""
        return self.root / "dia"

    @property
    def dac_dir(self) -> Path:
        return self.root / "dac"


def digest(kind: str, spec: FluxSpec | DiaSpec) -> str:
    """SHA-256 of the kind, the spec, this generator's version and its libraries."""
    identity = {
        "generator": MEDIA_GENERATOR_VERSION,
        "kind": kind,
        "spec": dataclasses.asdict(spec),
        "numpy": np.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }
    encoded = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()


def image_dir(cache: str | os.PathLike[str] | None = None, spec: FluxSpec = FluxSpec()) -> Path:
    return cache_root(cache) / f"image-{digest('image', spec)[:16]}"


def speech_dir(cache: str | os.PathLike[str] | None = None, spec: DiaSpec = DiaSpec()) -> Path:
    return cache_root(cache) / f"speech-{digest('speech', spec)[:16]}"


def ensure_image(
    cache: str | os.PathLike[str] | None = None, spec: FluxSpec = FluxSpec()
) -> ImageFixture:
    """The image fixture, generated first if the cache does not hold it."""
    return ImageFixture(build_once(image_dir(cache, spec), lambda d: write_image(spec, d)))


def ensure_speech(
    cache: str | os.PathLike[str] | None = None, spec: DiaSpec = DiaSpec()
) -> SpeechFixture:
    """The speech fixture, generated first if the cache does not hold it."""
    return SpeechFixture(build_once(speech_dir(cache, spec), lambda d: write_speech(spec, d)))


def fixture_bytes(root: Path) -> int:
    """The fixture's size on disk (its files' bytes)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# -- the image fixture ----------------------------------------------------------


def write_image(spec: FluxSpec, root: Path) -> None:
    rng = np.random.default_rng(spec.seed)
    t5 = {
        "vocab_size": 64, "d_model": spec.text_width, "d_kv": 8, "d_ff": 2 * spec.text_width,
        "num_layers": 1, "num_decoder_layers": None, "num_heads": 4,
        "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
        "dropout_rate": 0.0, "layer_norm_epsilon": 1e-6, "initializer_factor": 1.0,
        "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False, "is_decoder": False,
        "is_encoder_decoder": True, "use_cache": False, "pad_token_id": 0, "eos_token_id": 1,
        "decoder_start_token_id": 0, "_note": "random weights (test equipment)",
    }  # fmt: skip
    clip = {
        "vocab_size": 64, "projection_dim": spec.text_width, "hidden_act": "quick_gelu",
        "intermediate_size": 2 * spec.text_width, "max_position_embeddings": 77,
        "num_hidden_layers": 1, "num_attention_heads": 4,
    }  # fmt: skip
    flux = {
        "in_channels": FLUX_IN_CHANNELS, "pooled_projection_dim": spec.text_width,
        "joint_attention_dim": spec.text_width, "num_attention_heads": FLUX_HEADS,
        "num_layers": spec.double_blocks, "num_single_layers": spec.single_blocks,
        "guidance_embeds": False,
    }  # fmt: skip
    vae = {
        "in_channels": 3, "out_channels": 3, "block_out_channels": [spec.vae_channels] * 4,
        "layers_per_block": 1, "latent_channels": 16, "scaling_factor": 0.3611,
        "shift_factor": 0.1159, "norm_num_groups": 4,
    }  # fmt: skip
    model = root / "flux"
    _json(model / "transformer" / "config.json", flux)
    _json(model / "vae" / "config.json", vae)
    _save(model / "ae.safetensors", _vae(rng, vae))
    _save(model / "flux1-schnell.safetensors", _flux(rng, flux))
    hub = root / "hf-cache"
    _hub_file(hub, T5_TOKENIZER_REPO, "t5-v1_1-xxl.tokenizer.json", _tokenizer())
    encoder = _t5(rng, t5)
    names = sorted(encoder)
    half = len(names) // 2
    _hub_file(hub, T5_REPO, "config.json", json.dumps(t5))
    _hub_file(hub, T5_REPO, "t5_xxl-shard-0.safetensors", {k: encoder[k] for k in names[:half]})
    _hub_file(hub, T5_REPO, "t5_xxl-shard-1.safetensors", {k: encoder[k] for k in names[half:]})
    _hub_file(hub, CLIP_REPO, "config.json", json.dumps({"text_config": clip}))
    _hub_file(hub, CLIP_REPO, "model.safetensors", _clip(rng, clip))
    _hub_file(hub, CLIP_REPO, "tokenizer.json", _tokenizer())
    _fsync_tree(root)


def _tokenizer() -> str:
    vocab = {"<pad>": 0, "<unk>": 1}
    for word in _WORDS:
        vocab.setdefault(word, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))  # noqa: S106
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str()


def _hub_file(hub: Path, repo: str, name: str, content: str | Tensors) -> None:
    """One file of ``repo`` in the hub cache layout: ``refs/main`` → ``snapshots/<rev>/``."""
    base = hub / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(_SNAPSHOT)
    target = base / "snapshots" / _SNAPSHOT / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        target.write_text(content, encoding="utf-8")
    else:
        _save(target, content)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 0.02) -> Any:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)


def _linear(
    rng: np.random.Generator, t: Tensors, name: str, out_f: int, in_f: int, dtype: Any = np.float32
) -> None:
    t[f"{name}.weight"] = _normal(rng, (out_f, in_f)).astype(dtype)
    t[f"{name}.bias"] = np.zeros(out_f, dtype=dtype)


def _conv(rng: np.random.Generator, t: Tensors, name: str, out_c: int, in_c: int, k: int) -> None:
    t[f"{name}.weight"] = _normal(rng, (out_c, in_c, k, k), 0.1)
    t[f"{name}.bias"] = np.zeros(out_c, dtype=np.float32)


def _norm(t: Tensors, name: str, c: int) -> None:
    t[f"{name}.weight"] = np.ones(c, dtype=np.float32)
    t[f"{name}.bias"] = np.zeros(c, dtype=np.float32)


def _t5(rng: np.random.Generator, cfg: dict[str, Any]) -> Tensors:
    d, kv, heads, ff = cfg["d_model"], cfg["d_kv"], cfg["num_heads"], cfg["d_ff"]
    t: Tensors = {"shared.weight": _normal(rng, (cfg["vocab_size"], d), 1.0)}
    for i in range(cfg["num_layers"]):
        p = f"encoder.block.{i}.layer"
        for x in "qkv":
            t[f"{p}.0.SelfAttention.{x}.weight"] = _normal(rng, (heads * kv, d))
        t[f"{p}.0.SelfAttention.o.weight"] = _normal(rng, (d, heads * kv))
        if i == 0:
            buckets = cfg["relative_attention_num_buckets"]
            t[f"{p}.0.SelfAttention.relative_attention_bias.weight"] = _normal(
                rng, (buckets, heads)
            )
        t[f"{p}.0.layer_norm.weight"] = np.ones(d, dtype=np.float32)
        t[f"{p}.1.DenseReluDense.wi_0.weight"] = _normal(rng, (ff, d))
        t[f"{p}.1.DenseReluDense.wi_1.weight"] = _normal(rng, (ff, d))
        t[f"{p}.1.DenseReluDense.wo.weight"] = _normal(rng, (d, ff))
        t[f"{p}.1.layer_norm.weight"] = np.ones(d, dtype=np.float32)
    t["encoder.final_layer_norm.weight"] = np.ones(d, dtype=np.float32)
    return t


def _clip(rng: np.random.Generator, cfg: dict[str, Any]) -> Tensors:
    d, ff, p = cfg["projection_dim"], cfg["intermediate_size"], "text_model"
    t: Tensors = {
        f"{p}.embeddings.token_embedding.weight": _normal(rng, (cfg["vocab_size"], d)),
        f"{p}.embeddings.position_embedding.weight": _normal(
            rng, (cfg["max_position_embeddings"], d)
        ),
    }
    for i in range(cfg["num_hidden_layers"]):
        q = f"{p}.encoder.layers.{i}"
        for x in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(rng, t, f"{q}.self_attn.{x}", d, d)
        _norm(t, f"{q}.layer_norm1", d)
        _norm(t, f"{q}.layer_norm2", d)
        _linear(rng, t, f"{q}.mlp.fc1", ff, d)
        _linear(rng, t, f"{q}.mlp.fc2", d, ff)
    _norm(t, f"{p}.final_layer_norm", d)
    return t


def _resnet(rng: np.random.Generator, t: Tensors, name: str, cin: int, cout: int) -> None:
    _norm(t, f"{name}.norm1", cin)
    _conv(rng, t, f"{name}.conv1", cout, cin, 3)
    _norm(t, f"{name}.norm2", cout)
    _conv(rng, t, f"{name}.conv2", cout, cout, 3)
    if cin != cout:
        _conv(rng, t, f"{name}.nin_shortcut", cout, cin, 1)


def _attention(rng: np.random.Generator, t: Tensors, name: str, c: int) -> None:
    _norm(t, f"{name}.norm", c)
    for x in ("q", "k", "v", "proj_out"):
        _conv(rng, t, f"{name}.{x}", c, c, 1)


def _vae(rng: np.random.Generator, cfg: dict[str, Any]) -> Tensors:
    """The BFL autoencoder: encoder and decoder (the engine loads both)."""
    chans, per_block, latent = (
        cfg["block_out_channels"], cfg["layers_per_block"], cfg["latent_channels"],
    )  # fmt: skip
    t: Tensors = {}
    _conv(rng, t, "encoder.conv_in", chans[0], cfg["in_channels"], 3)
    block_in = chans[0]
    for level, out in enumerate(chans):
        block_in = chans[0] if level == 0 else chans[level - 1]
        for b in range(per_block):
            _resnet(rng, t, f"encoder.down.{level}.block.{b}", block_in, out)
            block_in = out
        if level != len(chans) - 1:
            _conv(rng, t, f"encoder.down.{level}.downsample.conv", block_in, block_in, 3)
    _resnet(rng, t, "encoder.mid.block_1", block_in, block_in)
    _attention(rng, t, "encoder.mid.attn_1", block_in)
    _resnet(rng, t, "encoder.mid.block_2", block_in, block_in)
    _norm(t, "encoder.norm_out", block_in)
    _conv(rng, t, "encoder.conv_out", 2 * latent, block_in, 3)
    block_in = chans[-1]
    _conv(rng, t, "decoder.conv_in", block_in, latent, 3)
    _resnet(rng, t, "decoder.mid.block_1", block_in, block_in)
    _attention(rng, t, "decoder.mid.attn_1", block_in)
    _resnet(rng, t, "decoder.mid.block_2", block_in, block_in)
    for level in reversed(range(len(chans))):
        out = chans[level]
        for b in range(per_block + 1):
            _resnet(rng, t, f"decoder.up.{level}.block.{b}", block_in, out)
            block_in = out
        if level != 0:
            _conv(rng, t, f"decoder.up.{level}.upsample.conv", block_in, block_in, 3)
    _norm(t, "decoder.norm_out", block_in)
    _conv(rng, t, "decoder.conv_out", cfg["out_channels"], block_in, 3)
    return t


def _flux(rng: np.random.Generator, cfg: dict[str, Any]) -> Tensors:
    """The transformer (BFL names), float16 as the real checkpoints ship it."""
    h, mlp, f16 = FLUX_HIDDEN, FLUX_HIDDEN * 4, np.float16
    head = h // cfg["num_attention_heads"]
    t: Tensors = {}
    _linear(rng, t, "img_in", h, cfg["in_channels"], f16)
    _linear(rng, t, "txt_in", h, cfg["joint_attention_dim"], f16)
    _linear(rng, t, "time_in.in_layer", h, 256, f16)
    _linear(rng, t, "time_in.out_layer", h, h, f16)
    _linear(rng, t, "vector_in.in_layer", h, cfg["pooled_projection_dim"], f16)
    _linear(rng, t, "vector_in.out_layer", h, h, f16)
    for i in range(cfg["num_layers"]):
        p = f"double_blocks.{i}"
        for s in ("img", "txt"):
            _linear(rng, t, f"{p}.{s}_mod.lin", 6 * h, h, f16)
            _linear(rng, t, f"{p}.{s}_attn.qkv", 3 * h, h, f16)
            t[f"{p}.{s}_attn.norm.query_norm.scale"] = np.ones(head, dtype=f16)
            t[f"{p}.{s}_attn.norm.key_norm.scale"] = np.ones(head, dtype=f16)
            _linear(rng, t, f"{p}.{s}_attn.proj", h, h, f16)
            _linear(rng, t, f"{p}.{s}_mlp.0", mlp, h, f16)
            _linear(rng, t, f"{p}.{s}_mlp.2", h, mlp, f16)
    for i in range(cfg["num_single_layers"]):
        p = f"single_blocks.{i}"
        _linear(rng, t, f"{p}.linear1", 3 * h + mlp, h, f16)
        _linear(rng, t, f"{p}.linear2", h, h + mlp, f16)
        t[f"{p}.norm.query_norm.scale"] = np.ones(head, dtype=f16)
        t[f"{p}.norm.key_norm.scale"] = np.ones(head, dtype=f16)
        _linear(rng, t, f"{p}.modulation.lin", 3 * h, h, f16)
    _linear(rng, t, "final_layer.linear", cfg["in_channels"], h, f16)
    _linear(rng, t, "final_layer.adaLN_modulation.1", 2 * h, h, f16)
    return t


# -- the speech fixture ---------------------------------------------------------


def write_speech(spec: DiaSpec, root: Path) -> None:
    rng = np.random.default_rng(spec.seed)
    w = spec.width
    config = {
        "version": "0.1",
        "model": {
            "encoder": {"n_layer": 1, "n_embd": w, "n_hidden": 2 * w, "n_head": 4,
                        "head_dim": w // 4},
            "decoder": {"n_layer": 1, "n_embd": w, "n_hidden": 2 * w, "gqa_query_heads": 4,
                        "kv_heads": 2, "gqa_head_dim": w // 4, "cross_query_heads": 4,
                        "cross_head_dim": w // 4},
            "src_vocab_size": 256, "tgt_vocab_size": DAC_CODEBOOK_SIZE + 4,
            "normalization_layer_epsilon": 1e-5, "weight_dtype": "float32",
            "rope_min_timescale": 1, "rope_max_timescale": 10000,
        },
        "data": {"text_length": 64, "audio_length": spec.audio_length,
                 "channels": DAC_CODEBOOKS, "text_pad_value": 0,
                 "audio_eos_value": DAC_CODEBOOK_SIZE, "audio_pad_value": DAC_CODEBOOK_SIZE + 1,
                 "audio_bos_value": DAC_CODEBOOK_SIZE + 2,
                 "delay_pattern": [0, 8, 9, 10, 11, 12, 13, 14, 15]},
    }  # fmt: skip
    _json(root / "dia" / "config.json", config)
    _save(root / "dia" / "model.safetensors", _dia(rng, config))
    _save(root / "dac" / "model.safetensors", _dac(rng))
    _fsync_tree(root)


def _dia_attention(
    rng: np.random.Generator, t: Tensors, p: str, q_in: int, kv_in: int, shape: tuple[int, ...]
) -> None:
    q_heads, kv_heads, head_dim, out = shape
    t[f"{p}.q_proj.weight"] = _normal(rng, (q_in, q_heads, head_dim))
    t[f"{p}.k_proj.weight"] = _normal(rng, (kv_in, kv_heads, head_dim))
    t[f"{p}.v_proj.weight"] = _normal(rng, (kv_in, kv_heads, head_dim))
    t[f"{p}.o_proj.weight"] = _normal(rng, (q_heads, head_dim, out))


def _dia_mlp(rng: np.random.Generator, t: Tensors, p: str, width: int, hidden: int) -> None:
    t[f"{p}.wi_fused.weight"] = _normal(rng, (width, 2, hidden))
    t[f"{p}.wo.weight"] = _normal(rng, (hidden, width))


def _dia(rng: np.random.Generator, cfg: dict[str, Any]) -> Tensors:
    """Dia's tensors: projections are "dense general" kernels (q ``[in, heads,
    head_dim]``, o ``[heads, head_dim, out]``, logits ``[width, channels, vocab]``)."""
    m, data = cfg["model"], cfg["data"]
    enc, dec = m["encoder"], m["decoder"]
    one = np.float32
    t: Tensors = {
        "encoder.embedding.weight": _normal(rng, (m["src_vocab_size"], enc["n_embd"]), 1.0),
        "encoder.norm.weight": np.ones(enc["n_embd"], dtype=one),
    }
    for i in range(enc["n_layer"]):
        p = f"encoder.layers.{i}"
        t[f"{p}.pre_sa_norm.weight"] = np.ones(enc["n_embd"], dtype=one)
        t[f"{p}.post_sa_norm.weight"] = np.ones(enc["n_embd"], dtype=one)
        shape = (enc["n_head"], enc["n_head"], enc["head_dim"], enc["n_embd"])
        _dia_attention(rng, t, f"{p}.self_attention", enc["n_embd"], enc["n_embd"], shape)
        _dia_mlp(rng, t, f"{p}.mlp", enc["n_embd"], enc["n_hidden"])
    for c in range(data["channels"]):
        t[f"decoder.embeddings.{c}.weight"] = _normal(
            rng, (m["tgt_vocab_size"], dec["n_embd"]), 1.0
        )
    t["decoder.norm.weight"] = np.ones(dec["n_embd"], dtype=one)
    for i in range(dec["n_layer"]):
        p = f"decoder.layers.{i}"
        for n in ("pre_sa_norm", "pre_ca_norm", "pre_mlp_norm"):
            t[f"{p}.{n}.weight"] = np.ones(dec["n_embd"], dtype=one)
        self_shape = (dec["gqa_query_heads"], dec["kv_heads"], dec["gqa_head_dim"], dec["n_embd"])
        _dia_attention(rng, t, f"{p}.self_attention", dec["n_embd"], dec["n_embd"], self_shape)
        heads = dec["cross_query_heads"]
        cross_shape = (heads, heads, dec["cross_head_dim"], dec["n_embd"])
        _dia_attention(rng, t, f"{p}.cross_attention", dec["n_embd"], enc["n_embd"], cross_shape)
        _dia_mlp(rng, t, f"{p}.mlp", dec["n_embd"], dec["n_hidden"])
    t["decoder.logits_dense.weight"] = _normal(
        rng, (dec["n_embd"], data["channels"], m["tgt_vocab_size"])
    )
    return t


def _weight_norm_conv(
    rng: np.random.Generator, t: Tensors, p: str, out_c: int, in_c: int, k: int, *, transposed: bool
) -> None:
    f16 = np.float16
    if transposed:  # weight_g over the input channels; weight_v is (in, out, k)
        t[f"{p}.weight_g"] = np.ones((in_c, 1, 1), dtype=f16)
        t[f"{p}.weight_v"] = _normal(rng, (in_c, out_c, k), 1.0).astype(f16)
    else:
        t[f"{p}.weight_g"] = np.ones((out_c, 1, 1), dtype=f16)
        t[f"{p}.weight_v"] = _normal(rng, (out_c, in_c, k), 1.0).astype(f16)
    t[f"{p}.bias"] = np.zeros(out_c, dtype=f16)


def _snake(t: Tensors, p: str, c: int) -> None:
    t[f"{p}.alpha"] = np.ones((1, c, 1), dtype=np.float16)


def _dac(rng: np.random.Generator) -> Tensors:
    """The DAC 44 kHz quantizer and decoder at the engine's fixed sizes (float16)."""
    t: Tensors = {}
    for i in range(DAC_CODEBOOKS):
        p = f"quantizer.quantizers.{i}"
        _weight_norm_conv(rng, t, f"{p}.in_proj", DAC_CODEBOOK_DIM, DAC_LATENT, 1, transposed=False)
        _weight_norm_conv(
            rng, t, f"{p}.out_proj", DAC_LATENT, DAC_CODEBOOK_DIM, 1, transposed=False
        )
        t[f"{p}.codebook.weight"] = _normal(rng, (DAC_CODEBOOK_SIZE, DAC_CODEBOOK_DIM), 1.0).astype(
            np.float16
        )
    d, channels = "decoder.model", DAC_CHANNELS
    _weight_norm_conv(rng, t, f"{d}.0", channels, DAC_LATENT, 7, transposed=False)
    for index, stride in enumerate(DAC_RATES):
        p, out = f"{d}.{index + 1}.block", channels // 2
        _snake(t, f"{p}.0", channels)
        _weight_norm_conv(rng, t, f"{p}.1", out, channels, 2 * stride, transposed=True)
        for r in (2, 3, 4):
            q = f"{p}.{r}.block"
            _snake(t, f"{q}.0", out)
            _weight_norm_conv(rng, t, f"{q}.1", out, out, 7, transposed=False)
            _snake(t, f"{q}.2", out)
            _weight_norm_conv(rng, t, f"{q}.3", out, out, 1, transposed=False)
        channels = out
    _snake(t, f"{d}.{len(DAC_RATES) + 1}", channels)
    _weight_norm_conv(rng, t, f"{d}.{len(DAC_RATES) + 2}", 1, channels, 7, transposed=False)
    return t


# -- files ----------------------------------------------------------------------


def _save(path: Path, tensors: Tensors) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(path), metadata={"format": "pt"})


def _json(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _fsync_tree(root: Path) -> None:
    """Every file and folder under ``root`` readable by anyone, and fsynced."""
    for path in sorted(root.rglob("*"), reverse=True):
        path.chmod(0o755 if path.is_dir() else 0o644)
        fsync_path(path)
    fsync_path(root)
