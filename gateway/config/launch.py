"""The pinned worker launch (spec §11, §12, §16): :class:`LaunchConfig` for one
model (``mistralrs serve``) or several (:class:`ModelLaunch` entries, ``mistralrs
from-config``), and the checks both share: a model directory addressed by its
bundle digest, and a quantized file only where the format needs one.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from gateway.config.base import Hex64, Model, PositiveInt

#: Flags that turn on the worker's agents, tools, MCP or their sandbox. They come
#: from a route's ``agents`` section only (spec §22), never from ``extra_args``.
AGENT_FLAG_PREFIXES = (
    "--agent",
    "--enable-search",
    "--enable-code-execution",
    "--enable-shell",
    "--max-tool-rounds",
    "--tool-",
    "--mcp",
    "--sandbox",
    "--search",
    "--code-exec",
    "--shell",
    "--skills",
)
#: Flags the launch contract writes itself, or that it never launches (request
#: logs, the UI, adapters): not for ``extra_args`` either.
CONTRACT_FLAG_PREFIXES = (
    "--host",
    "--port",
    "--no-ui",
    "--ui",
    "--log",
    "--access-log",
    "--format",
    "--quantized",
    "--model-id",
    "--max-seqs",
    "--max-seq-len",
    "--max-batch-size",
    "--paged-attn",
    "--prefix-cache-n",
    "--max-num-images",
    "--max-edge",
    "--cpu",
    "--lora",
    "--enable-",
)


def _extra_arg(token: str) -> str:
    """One ``extra_args`` token: a value, or a long flag the contract leaves open.
    A refusal names the flag family, never the token (it may hold a value)."""
    if not token.startswith("-"):
        return token
    name = token.split("=", 1)[0]
    for prefix in AGENT_FLAG_PREFIXES:
        if name.startswith(prefix):
            raise ValueError(
                f"agents_flag_forbidden: {prefix}… flags are never launched from extra_args; "
                "declare the worker's tools under its `agents` section"
            )
    if not name.startswith("--"):
        raise ValueError("short flags are not allowed in extra_args")
    for prefix in CONTRACT_FLAG_PREFIXES:
        if name.startswith(prefix):
            raise ValueError(f"{prefix}… is set by the launch contract or never launched")
    return token
    name = token.split("=", 1)[0]
    if name.startswith(AGENT_FLAG_PREFIXES):
        raise ValueError(
            f"agents_flag_forbidden: {name} is never launched from extra_args; declare "
            "the worker's tools under its `agents` section"
        )
    if not name.startswith("--") or name.startswith(CONTRACT_FLAG_PREFIXES):
        raise ValueError(f"{name} is set by the launch contract or never launched")
    return token


def _digest_addressed(model_dir: str, bundle: str) -> None:
    if not model_dir.startswith("/"):
        # A relative -m that is not a local folder is read as a hub id (and downloaded).
        raise ValueError("model_dir must be an absolute path")
    if model_dir.rstrip("/").rsplit("/", 1)[-1] != bundle:
        raise ValueError("model_dir must end with /<model_bundle_sha256>")


def _quantized_file(format: str, quantized_file: str | None) -> None:
    if format == "plain" and quantized_file is not None:
        raise ValueError("quantized_file is only for format gguf or ggml")
    if format != "plain" and quantized_file is None:
        raise ValueError(f"format {format} needs quantized_file (the file name inside model_dir)")
    if quantized_file is not None and ("/" in quantized_file or quantized_file.startswith(".")):
        raise ValueError("quantized_file is a file name inside model_dir, not a path")


class ModelLaunch(Model):
    """One model of a multi-model worker (``mistralrs from-config``)."""

    model_public_id: str = Field(
        description="The model's public id, for humans (a hub id alone is not immutable).",
    )
    model_revision: Annotated[str, Field(min_length=1)] = Field(
        description="The upstream commit of the model.",
    )
    model_bundle_sha256: Hex64 = Field(
        description=(
            "Digest of the reviewed local model directory (`mistralrs-gateway bundle-digest`)."
        ),
    )
    model_dir: str = Field(
        description=(
            "Absolute path of the bundle, ending with `/<model_bundle_sha256>`; one of the "
            "upstream's routes (the model's id at the worker)."
        ),
    )
    format: Literal["plain", "gguf", "ggml"] = Field("plain", description="Model format.")
    quantized_file: str | None = Field(
        None,
        description="gguf/ggml only: the model file's name inside model_dir (-f).",
    )
    kind: Literal["auto", "text", "multimodal", "embedding"] = Field(
        "auto",
        description="The from-config model kind (`auto` lets the worker detect it).",
    )

    @model_validator(mode="after")
    def _checks(self) -> ModelLaunch:
        _digest_addressed(self.model_dir, self.model_bundle_sha256)
        _quantized_file(self.format, self.quantized_file)
        return self


class LaunchConfig(Model):
    """The pinned worker (spec §11, §12 "Launch contract", §16).

    One model (``model_*`` fields, ``mistralrs serve``), or several
    (``models``, ``mistralrs from-config`` with a generated TOML file)."""

    version: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] = Field(
        description="Exact mistral.rs release MAJOR.MINOR.PATCH (`latest` is refused).",
    )
    binary_sha256: Hex64 = Field(
        description="SHA-256 of the `mistralrs` binary (64 lowercase hex).",
    )
    model_public_id: str | None = Field(
        None,
        description=(
            "One-model launch: the model's public id, for humans (a hub id alone is not immutable)."
        ),
    )
    model_revision: Annotated[str, Field(min_length=1)] | None = Field(
        None, description="One-model launch: the upstream commit of the model."
    )
    model_bundle_sha256: Hex64 | None = Field(
        None,
        description=(
            "One-model launch: digest of the reviewed local model directory "
            "(`mistralrs-gateway bundle-digest`)."
        ),
    )
    model_dir: str | None = Field(
        None,
        description=(
            "One-model launch: absolute path of the bundle, ending with "
            "`/<model_bundle_sha256>`; must equal the upstream's route (the worker's -m)."
        ),
    )
    format: Literal["plain", "gguf", "ggml"] = Field(
        "plain", description="One-model launch: model format (--format)."
    )
    quantized_file: str | None = Field(
        None,
        description=(
            "One-model gguf/ggml launch: the model file's name inside model_dir "
            "(-f/--quantized-file)."
        ),
    )
    models: list[ModelLaunch] | None = Field(
        None,
        description=(
            "A multi-model worker's models (instead of the model_* fields): launched with "
            "`mistralrs from-config`, each served under its model_dir."
        ),
    )
    config_path: str | None = Field(
        None,
        description=(
            "Multi-model only: where the pod mounts the generated from-config TOML "
            "(default /etc/mistralrs/models.toml)."
        ),
    )
    port: Annotated[int, Field(ge=1, le=65535)] = Field(
        1234,
        description="Worker port; must equal the port of the upstream's base_url.",
    )
    max_seqs: PositiveInt = Field(8, description="--max-seqs: sequences the worker runs at once.")
    max_seq_len: PositiveInt = Field(4096, description="--max-seq-len.")
    max_batch_size: PositiveInt = Field(1, description="--max-batch-size.")
    paged_attn: Literal["auto", "on", "off"] = Field("auto", description="--paged-attn.")
    prefix_cache_n: Annotated[int, Field(ge=0)] = Field(16, description="--prefix-cache-n.")
    max_num_images: PositiveInt = Field(8, description="--max-num-images.")
    max_edge: PositiveInt = Field(1024, description="--max-edge (pixels).")
    device: Literal["cpu", "cuda", "metal"] = Field(
        "cpu",
        description=(
            "`cpu` adds --cpu; `cuda` and `metal` use what the pinned binary was built for."
        ),
    )
    extra_args: list[Annotated[str, AfterValidator(_extra_arg)]] | None = Field(
        None,
        description=(
            "One-model launch: further `serve` flags, appended as given; never the contract's "
            "own flags, nor agentic ones (`agents_flag_forbidden`)."
        ),
    )

    @model_validator(mode="after")
    def _one_or_many(self) -> LaunchConfig:
        single = (
            self.model_public_id,
            self.model_revision,
            self.model_bundle_sha256,
            self.model_dir,
        )
        if self.models is not None:
            if any(v is not None for v in single) or self.quantized_file is not None:
                raise ValueError("give either the model_* fields or models, not both")
            if self.format != "plain":
                raise ValueError("with models, give each model its format")
            if self.extra_args is not None:
                raise ValueError("extra_args is for a one-model launch (`mistralrs serve`)")
            if not self.models:
                raise ValueError("models must name at least one model")
            dirs = [m.model_dir for m in self.models]
            if len(dirs) != len(set(dirs)):
                raise ValueError("each model of models needs its own model_dir")
            return self
        if any(v is None for v in single):
            raise ValueError(
                "a one-model launch needs model_public_id, model_revision, "
                "model_bundle_sha256 and model_dir"
            )
        if self.config_path is not None:
            raise ValueError("config_path is for a multi-model launch (models) only")
        assert self.model_dir is not None and self.model_bundle_sha256 is not None
        _digest_addressed(self.model_dir, self.model_bundle_sha256)
        _quantized_file(self.format, self.quantized_file)
        return self

    @property
    def model_dirs(self) -> list[str]:
        """The routes this launch serves (each model's ``model_dir``)."""
        if self.models is not None:
            return [m.model_dir for m in self.models]
        assert self.model_dir is not None
        return [self.model_dir]

    def version_tuple(self) -> tuple[int, int, int]:
        major, minor, patch = (int(p) for p in self.version.split("."))
        return major, minor, patch
