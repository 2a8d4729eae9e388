"""The one typed gateway config (spec §3, §15).

Every section is a frozen pydantic model with ``extra="forbid"``: a misspelt
key is an error, never a silent default. Relative paths resolve against the
folder of the config file (passed as validation context ``base_dir``).
Cross-field rules that need more than one section live in
:func:`GatewayConfig._cross_checks`; policy-vs-config rules live in
``policy.py``.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.core.sse import Framing


def _resolve(value: Path, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir")
    if value.is_absolute() or base is None:
        return value
    return Path(base) / value


RelPath = Annotated[Path, AfterValidator(_resolve)]
PositiveFloat = Annotated[float, Field(gt=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Model(BaseModel):
    # validate_default: defaulted paths are resolved against the config folder too.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class TLSConfig(Model):
    """TLS on the listener; omit the section for plain HTTP (loopback and tests only)."""

    certfile: RelPath = Field(description="Server certificate chain (PEM).")
    keyfile: RelPath = Field(description="Private key of the certificate (PEM, unencrypted).")
    client_ca: RelPath | None = Field(
        None,
        description=(
            "CA bundle (PEM); when set, every client must present a certificate it issued (mTLS)."
        ),
    )


class ListenConfig(Model):
    """The callers' listener."""

    host: str = Field("0.0.0.0", description="Address to bind.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        8443,
        description="Port to bind (0: the OS chooses; `serve` prints the one chosen).",
    )
    tls: TLSConfig | None = Field(None, description="TLS settings; absent: plain HTTP.")
    shutdown_grace_s: Annotated[float, Field(ge=0)] = Field(
        30,
        description="SIGTERM: how long requests in flight may finish before they are ended.",
    )
    # Not in the spec's example (added for hostile clients, see docs/security.md):
    # a request head must arrive within header_timeout_s of its first byte (or of
    # the connection), a body within body_timeout_s of its head.
    header_timeout_s: Annotated[float, Field(gt=0, le=300)] = Field(
        10,
        description=(
            "A request head must be complete this long after its first byte (or the "
            "connection); else 408."
        ),
    )
    body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = Field(
        30,
        description="A request body must be complete this long after its head; else 408.",
    )
    max_header_bytes: Annotated[int, Field(ge=4096, le=1_048_576)] = Field(
        32_768,
        description="Cap on the request line plus headers; more is 431.",
    )


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


class ProbeConfig(Model):
    """Semantic readiness (spec §16): a tiny request (``max_tokens`` tokens, or one
    embedding) through the full validator."""

    kind: Literal["chat", "embeddings"] = Field(
        "chat",
        description="What the route serves: a streamed chat completion, or an embedding.",
    )
    max_tokens: Annotated[int, Field(ge=1, le=16)] = Field(
        1, description="Output tokens the chat probe asks for."
    )
    timeout_s: PositiveFloat = Field(
        30, description="The probe's whole budget; slower is `probe_failed`."
    )
    prompt: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        "ping", description="The probe's input text."
    )


UPSTREAM_NAME = r"^[a-z0-9-]{1,32}$"


class UpstreamConfig(Model):
    """One worker. ``upstream:`` (one worker, named ``default``, one ``route``)
    or each entry of ``upstreams:`` (``name`` and ``routes``)."""

    name: Annotated[str, Field(pattern=UPSTREAM_NAME)] = Field(
        "default",
        description="The worker's name in metrics, receipts and /readyz (`upstreams:` entries).",
    )
    base_url: str = Field(
        "http://127.0.0.1:1234",
        description="The worker's http(s) origin (no path).",
    )
    allow_remote: bool = Field(
        False, description="Allow a base_url that is not a loopback address."
    )
    route: Annotated[str, Field(min_length=1)] | None = Field(
        None,
        description=(
            "`upstream:` only: the one route (the worker's model id) the aliases may point at."
        ),
    )
    routes: list[Annotated[str, Field(min_length=1)]] = Field(
        [],
        description="`upstreams:` entries: the exact routes this worker serves.",
    )
    capacity: PositiveInt | None = Field(
        None,
        description="This worker's admission permits (default: admission.capacity).",
    )
    probe: ProbeConfig | None = Field(
        None,
        description=(
            "A request through the full validator before a route counts as ready; absent: "
            "the models listing alone."
        ),
    )
    connect_timeout_s: PositiveFloat = Field(
        2, description="Connecting to the worker; five times it bounds each write of a body."
    )
    first_event_timeout_s: PositiveFloat = Field(
        120,
        description=(
            "From starting the worker call (connecting and sending the body count) to its "
            "first event, a keep-alive included (or to the whole JSON answer)."
        ),
    )
    idle_timeout_s: PositiveFloat = Field(
        30, description="Longest silence between two events (keep-alives count)."
    )
    total_timeout_s: PositiveFloat = Field(
        600, description="A whole worker exchange; also sizes the shared limits' leases."
    )
    readiness_poll_s: PositiveFloat = Field(2, description="Interval of the readiness poll.")
    readiness_timeout_s: PositiveFloat = Field(
        2,
        description=(
            "Budget of one readiness poll of the models listing (and of the first poll at "
            "start); five times it bounds GET/DELETE /v1/responses/{id} at the worker."
        ),
    )
    max_request_bytes: PositiveInt = Field(
        52_428_800,
        description="Largest body the worker accepts (the worker's own 50 MB limit).",
    )
    max_line_bytes: PositiveInt = Field(
        1_048_576,
        description=(
            "Longest SSE line (and event) accepted from the worker; also the largest JSON "
            "answer of GET/DELETE /v1/responses/{id}."
        ),
    )
    max_stream_bytes: PositiveInt = Field(
        67_108_864, description="Most bytes accepted in one worker answer."
    )
    max_events: PositiveInt = Field(100_000, description="Most events in one worker answer.")
    text_nul: Literal["replace", "pass", "reject"] = Field(
        "replace",
        description=(
            "U+0000 in streamed text (spec §14): replace with U+FFFD, pass, or reject "
            "(upstream_protocol_error)."
        ),
    )
    launch: LaunchConfig | None = Field(
        None,
        description="The pinned worker launch (`launch-plan`); absent: the worker is external.",
    )

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http(s) URL with a host")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("must not carry a path, query or fragment")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _checks(self) -> UpstreamConfig:
        if not self.allow_remote and not is_loopback_host(urlsplit(self.base_url).hostname or ""):
            raise ValueError("base_url must be a loopback address unless allow_remote is true")
        if (self.route is None) == (not self.routes):
            raise ValueError("give exactly one of route (upstream:) or routes (upstreams:)")
        if len(self.served_routes) != len(set(self.served_routes)):
            raise ValueError("routes must be distinct")
        if self.launch is not None:
            if self.launch.port != self.port:
                raise ValueError("launch.port must equal the port of base_url")
            if sorted(self.launch.model_dirs) != sorted(self.served_routes):
                raise ValueError(
                    "launch's model_dir(s) must equal the routes (the worker's model ids)"
                )
        return self

    @property
    def served_routes(self) -> list[str]:
        return [self.route] if self.route is not None else list(self.routes)

    @property
    def framing(self) -> Framing:
        """The stream bounds a worker answer is read under."""
        return Framing(
            max_line_bytes=self.max_line_bytes,
            max_event_bytes=self.max_line_bytes,
            max_stream_bytes=self.max_stream_bytes,
            max_events=self.max_events,
        )

    @property
    def host(self) -> str:
        return urlsplit(self.base_url).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.base_url)
        return parts.port or (443 if parts.scheme == "https" else 80)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class IssuerConfig(Model):
    """One JWT issuer: exactly one of jwks_file, jwks_url, hs256_secret_env."""

    issuer: Annotated[str, Field(min_length=1)] = Field(
        description="The `iss` value its tokens carry.",
    )
    audience: Annotated[str, Field(min_length=1)] = Field(
        description="The `aud` value its tokens must carry.",
    )
    algorithms: Annotated[list[str], Field(min_length=1)] = Field(
        description=(
            "Allowed `alg` values (`none` is never accepted; HS256 only with hs256_secret_env)."
        ),
    )
    jwks_file: RelPath | None = Field(
        None,
        description=(
            "JWKS file with the issuer's public keys (re-read on SIGHUP and on an unknown `kid`)."
        ),
    )
    jwks_url: str | None = Field(
        None,
        description=(
            "JWKS URL (https, or http to a loopback host); fetched at start and on an unknown"
            " `kid`."
        ),
    )
    hs256_secret_env: str | None = Field(
        None,
        description=(
            "Environment variable holding the HS256 secret (at least 32 bytes); never the "
            "secret itself."
        ),
    )
    tenant_claim: str = Field("tenant", description="Claim naming the tenant.")
    scope_claim: str = Field(
        "scope",
        description="Claim holding the scopes (a space-separated string or a list).",
    )
    leeway_s: Annotated[float, Field(ge=0)] = Field(
        30,
        description="Clock skew tolerated on exp, nbf and iat.",
    )
    max_lifetime_s: PositiveFloat = Field(
        3600,
        description="Tokens whose exp - iat exceeds this are refused.",
    )
    jwks_refresh_min_s: Annotated[float, Field(ge=0)] = Field(
        2,
        description="An unknown `kid` re-reads the issuer's keys at most this often.",
    )
    jwks_max_bytes: PositiveInt = Field(
        1_048_576,
        description="Size bound of a JWKS file or download.",
    )

    @field_validator("algorithms")
    @classmethod
    def _allowlist(cls, value: list[str]) -> list[str]:
        allowed = {
            "RS256",
            "RS384",
            "RS512",
            "PS256",
            "PS384",
            "PS512",
            "ES256",
            "ES384",
            "ES512",
            "EdDSA",
            "HS256",
            "HS384",
            "HS512",
        }
        bad = [a for a in value if a not in allowed]
        if bad:
            raise ValueError(
                f"algorithms not allowed: {', '.join(sorted(set(bad)))} ('none' is never accepted)"
            )
        return value

    @model_validator(mode="after")
    def _one_key_source(self) -> IssuerConfig:
        sources = [s for s in (self.jwks_file, self.jwks_url, self.hs256_secret_env) if s]
        if len(sources) != 1:
            raise ValueError("exactly one of jwks_file, jwks_url, hs256_secret_env is required")
        symmetric = {a for a in self.algorithms if a.startswith("HS")}
        if self.hs256_secret_env and set(self.algorithms) != {"HS256"}:
            raise ValueError("hs256_secret_env issuers must list algorithms: [HS256]")
        if not self.hs256_secret_env and symmetric:
            # An HS algorithm next to public keys is the classic key-confusion hole.
            raise ValueError("HS algorithms need hs256_secret_env, not public keys")
        return self


class AuthConfig(Model):
    """Who may call: JWT issuers (static API keys are in the tenant policies)."""

    issuers: list[IssuerConfig] = Field(
        [],
        description="The configured issuers (unique `issuer` values).",
    )

    @field_validator("issuers")
    @classmethod
    def _unique(cls, value: list[IssuerConfig]) -> list[IssuerConfig]:
        names = [i.issuer for i in value]
        if len(names) != len(set(names)):
            raise ValueError("issuer values must be unique")
        return value


class StagingConfig(Model):
    """Evidence staging (spec sections 5 and 13)."""

    dir: RelPath = Field(
        Path("var/evidence"),
        description="Gateway-side evidence store (read-write); files are `<sha256>.<ext>`.",
    )
    catalog: RelPath = Field(
        Path("var/catalog.sqlite3"),
        description="SQLite catalog of the evidence records.",
    )
    worker_media: Literal["data_url", "file_url"] = Field(
        "data_url",
        description=(
            "How media reach the worker: data_url (every release) or file_url (worker <= 0.8.17)."
        ),
    )
    worker_url_prefix: str | None = Field(
        None,
        description="file_url only: the staging dir as the worker mounts it (`file:///...`).",
    )
    max_concurrent_uploads: PositiveInt = Field(
        4,
        description=(
            "Uploads read at once (each streams to a temp file); the next gets 429 queue_full."
        ),
    )
    expiry_sweep_s: PositiveFloat = Field(
        30,
        description="How often records past a tenant's evidence.ttl_s are forgotten.",
    )

    @model_validator(mode="after")
    def _prefix_for_file_url(self) -> StagingConfig:
        prefix = self.worker_url_prefix or ""
        if self.worker_media == "file_url" and not prefix.startswith("file:///"):
            raise ValueError("file_url mode needs worker_url_prefix: file:///<dir>")
        return self


class AdmissionConfig(Model):
    """Weighted admission permits (spec section 7)."""

    capacity: PositiveInt = Field(
        8,
        description="Permit units in total (size it to the worker's --max-seqs).",
    )
    max_queue: Annotated[int, Field(ge=0)] = Field(
        64,
        description=(
            "Requests waiting for permits across all tenants; one more gets 429 queue_full."
        ),
    )


class LimitsConfig(Model):
    """Global ceilings; a tenant policy can only lower them."""

    max_body_bytes: PositiveInt = Field(
        1_048_576,
        description="Bytes of a JSON API request body (uploads are bounded by max_media_bytes).",
    )
    max_prompt_bytes: PositiveInt = Field(
        65_536,
        description="Bytes of everything the worker tokenizes or compiles in one request.",
    )
    max_media_parts: Annotated[int, Field(ge=0)] = Field(
        8,
        description="Media parts in one request.",
    )
    max_media_bytes: PositiveInt = Field(
        36_700_160,
        description=(
            "Bytes of the media of one request, and of one upload (data_url mode: x 4/3 must "
            "fit upstream.max_request_bytes)."
        ),
    )
    max_output_tokens: PositiveInt = Field(
        4096,
        description="Ceiling of max_tokens (a request without one gets this).",
    )
    max_json_depth: PositiveInt = Field(32, description="Nesting depth of a JSON request body.")
    max_embedding_inputs: PositiveInt = Field(
        256,
        description="Inputs in one embeddings request (spec section 14).",
    )


_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


class CorsConfig(Model):
    """Browser origins allowed to call (exact matches only)."""

    allow_origins: list[str] = Field(
        [],
        description="Exact origins scheme://host[:port]; empty: no CORS headers at all.",
    )
    max_age_s: Annotated[int, Field(ge=0)] = Field(
        600,
        description="access-control-max-age of preflight answers.",
    )

    @field_validator("allow_origins")
    @classmethod
    def _exact(cls, value: list[str]) -> list[str]:
        bad = [o for o in value if not _ORIGIN.match(o)]
        if bad:
            raise ValueError("each origin must be exact scheme://host[:port] (no '*', no path)")
        return value


class AuditConfig(Model):
    """Receipts: one JSON line per authenticated inference request (spec sections 10 and 13)."""

    path: RelPath = Field(
        Path("receipts.jsonl"),
        description="Append-only JSON-lines receipts file.",
    )
    max_pending: PositiveInt = Field(
        100_000,
        description="Receipts kept in memory while the file cannot be written (spec section 13).",
    )
    flush_timeout_s: Annotated[float, Field(ge=0)] = Field(
        5,
        description="How long a drain waits for the writer.",
    )
    rotate_bytes: Annotated[int, Field(ge=0)] = Field(
        0,
        description=(
            "Rotate to `<path>.1` ... `<path>.<keep>` before the file passes this size (0: off)."
        ),
    )
    keep: Annotated[int, Field(ge=0, le=1000)] = Field(10, description="Rotated files kept.")


class MetricsListen(Model):
    """A separate plain-HTTP listener for the metrics endpoint."""

    host: str = Field("0.0.0.0", description="Address to bind.")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(9464, description="Port to bind.")


class MetricsConfig(Model):
    """Prometheus metrics."""

    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9/_-]*$")] = Field(
        "/metrics",
        description="Path of the metrics endpoint.",
    )
    listen: MetricsListen | None = Field(
        None,
        description=(
            "Serve metrics on this plain-HTTP listener instead of the main one (spec section 13)."
        ),
    )


class ResponsesConfig(Model):
    """Responses API bookkeeping (spec section 14)."""

    ttl_s: Annotated[int, Field(ge=1, le=31_536_000)] = Field(
        86_400,
        description=(
            "How long a relayed Responses id stays the tenant's (previous_response_id, GET, "
            "DELETE); at most a year."
        ),
    )


class LoggingConfig(Model):
    """Logs: JSON lines on stderr."""

    level: Literal["debug", "info", "warning", "error"] = Field(
        "info",
        description="Log level (the GATEWAY_LOG_LEVEL environment variable overrides it).",
    )


class LimitsStoreConfig(Model):
    """Where tenant rate limits live (spec §15): this process, or a shared Redis."""

    backend: Literal["memory", "redis"] = Field(
        "memory",
        description="memory: this process only; redis: shared by every replica.",
    )
    url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="redis:// or rediss:// URL (no password in it).",
    )
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = Field(
        None,
        description=(
            "Environment variable holding the Redis password (never the password itself)."
        ),
    )
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9:._-]{0,64}$")] = Field(
        "mrgw:",
        description="Prefix of every Redis key (one per environment).",
    )
    timeout_ms: Annotated[int, Field(ge=1, le=60_000)] = Field(
        50,
        description=(
            "Bound of each store call (connecting, and the whole script call); a batch of "
            "settlements gets one more per 64 scripts."
        ),
    )
    on_error: Literal["closed", "open"] = Field(
        "closed",
        description=(
            "Store unreachable or slow: closed answers 503 limits_unavailable; open serves "
            "unchecked."
        ),
    )

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError("must be a redis:// or rediss:// URL with a host")
        if parts.password is not None:
            raise ValueError("must not carry a password (use password_env)")
        if parts.path not in ("", "/") and not re.fullmatch(r"/[0-9]{1,5}", parts.path):
            raise ValueError("path must be a database number, e.g. /0")
        if parts.query or parts.fragment:
            raise ValueError("must not carry a query or fragment")
        try:
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            raise ValueError("has an invalid port") from exc
        return value


class GatewayConfig(Model):
    """gateway.yaml: one typed object, validated whole before anything starts."""

    listen: ListenConfig = Field(ListenConfig(), description="The callers' listener.")
    upstream: UpstreamConfig | None = Field(
        None,
        description=(
            "One worker (the shorthand: one `route`, named `default` unless `name` says "
            "otherwise); or `upstreams`."
        ),
    )
    upstreams: list[UpstreamConfig] | None = Field(
        None,
        description="Several workers (spec §16), each with a `name` and its `routes`.",
    )
    auth: AuthConfig = Field(AuthConfig(), description="Token issuers and API-key settings.")
    policies_dir: RelPath = Field(
        Path("policies"),
        description="Directory of the tenant policies (`<tenant>.yaml`), relative to the config.",
    )
    staging: StagingConfig = Field(
        StagingConfig(), description="Evidence staging: files, catalog, uploads."
    )
    admission: AdmissionConfig = Field(
        AdmissionConfig(), description="Weighted admission permits and their queue."
    )
    limits: LimitsConfig = Field(
        LimitsConfig(), description="Gateway-wide ceilings over every tenant's limits."
    )
    cors: CorsConfig = Field(CorsConfig(), description="Exact-origin CORS.")
    audit: AuditConfig = Field(AuditConfig(), description="Receipts: the audit file.")
    metrics: MetricsConfig = Field(MetricsConfig(), description="Prometheus metrics.")
    responses: ResponsesConfig = Field(
        ResponsesConfig(), description="Responses API ids the gateway keeps."
    )
    logging: LoggingConfig = Field(LoggingConfig(), description="Operator logs (stderr).")
    limits_store: LimitsStoreConfig = Field(
        LimitsStoreConfig(),
        description="Where tenant rate limits are counted: this process, or Redis (spec §15).",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewayConfig:
        if (self.upstream is None) == (self.upstreams is None):
            raise ValueError("give exactly one of upstream (one worker) or upstreams")
        if self.upstream is not None and self.upstream.routes:
            raise ValueError("upstream (the one-worker form) takes route, not routes")
        if self.upstreams is not None:
            if not self.upstreams:
                raise ValueError("upstreams must list at least one worker")
            if any(u.route is not None for u in self.upstreams):
                raise ValueError("each entry of upstreams takes routes, not route")
            names = [u.name for u in self.upstreams]
            if len(names) != len(set(names)):
                raise ValueError("upstream names must be unique")
            routes = [r for u in self.upstreams for r in u.served_routes]
            if len(routes) != len(set(routes)):
                raise ValueError("each route must be served by exactly one upstream")
            ports = [u.launch.port for u in self.upstreams if u.launch is not None]
            if len(ports) != len(set(ports)):
                raise ValueError("each launched worker needs its own port")
        # base64 grows bytes by 4/3; the forwarded body must fit every worker's limit.
        media = self.limits.max_media_bytes * 4 // 3
        smallest = min(u.max_request_bytes for u in self.workers)
        if self.staging.worker_media == "data_url" and media > smallest:
            raise ValueError(
                "limits.max_media_bytes x 4/3 exceeds upstream.max_request_bytes (data_url mode)"
            )
        return self

    @property
    def workers(self) -> list[UpstreamConfig]:
        """Every configured worker (``upstreams``, or the one ``upstream``)."""
        if self.upstreams is not None:
            return list(self.upstreams)
        assert self.upstream is not None
        return [self.upstream]

    @property
    def routes(self) -> dict[str, UpstreamConfig]:
        """Route -> the worker serving it."""
        return {route: u for u in self.workers for route in u.served_routes}
