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

from gateway.sse import Framing


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


class LaunchConfig(Model):
    """The pinned worker (spec §11, §12 "Launch contract")."""

    version: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] = Field(
        description="Exact mistral.rs release MAJOR.MINOR.PATCH (`latest` is refused).",
    )
    binary_sha256: Hex64 = Field(
        description="SHA-256 of the `mistralrs` binary (64 lowercase hex).",
    )
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
            "Absolute path of the bundle, ending with `/<model_bundle_sha256>`; must equal "
            "upstream.route (the worker's -m)."
        ),
    )
    format: Literal["plain", "gguf", "ggml"] = Field(
        "plain",
        description="Model format (--format).",
    )
    port: Annotated[int, Field(ge=1, le=65535)] = Field(
        1234,
        description="Worker port; must equal the port of upstream.base_url.",
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
    def _digest_addressed(self) -> LaunchConfig:
        if not self.model_dir.startswith("/"):
            # A relative -m that is not a local folder is read as a hub id (and downloaded).
            raise ValueError("model_dir must be an absolute path")
        if self.model_dir.rstrip("/").rsplit("/", 1)[-1] != self.model_bundle_sha256:
            raise ValueError("model_dir must end with /<model_bundle_sha256>")
        return self

    def version_tuple(self) -> tuple[int, int, int]:
        major, minor, patch = (int(p) for p in self.version.split("."))
        return major, minor, patch


class UpstreamConfig(Model):
    base_url: str = "http://127.0.0.1:1234"
    allow_remote: bool = False
    route: Annotated[str, Field(min_length=1)]
    connect_timeout_s: PositiveFloat = 2
    first_event_timeout_s: PositiveFloat = 120
    idle_timeout_s: PositiveFloat = 30
    total_timeout_s: PositiveFloat = 600
    readiness_poll_s: PositiveFloat = 2
    readiness_timeout_s: PositiveFloat = 2
    max_request_bytes: PositiveInt = 52_428_800
    max_line_bytes: PositiveInt = 1_048_576
    max_stream_bytes: PositiveInt = 67_108_864
    max_events: PositiveInt = 100_000
    #: U+0000 in streamed text (spec §14): replace with U+FFFD, pass, or reject
    text_nul: Literal["replace", "pass", "reject"] = "replace"
    launch: LaunchConfig | None = None

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
    def _loopback_unless_allowed(self) -> UpstreamConfig:
        if not self.allow_remote and not is_loopback_host(urlsplit(self.base_url).hostname or ""):
            raise ValueError("base_url must be a loopback address unless allow_remote is true")
        if self.launch is not None:
            if self.launch.port != self.port:
                raise ValueError("launch.port must equal the port of base_url")
            if self.launch.model_dir != self.route:
                raise ValueError("launch.model_dir must equal route (the worker's --model-id)")
        return self

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

    ttl_s: PositiveInt = Field(
        86_400,
        description=(
            "How long a relayed Responses id stays the tenant's (previous_response_id, GET, "
            "DELETE)."
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
        description="Bound of each store call (connect, socket and the whole script call).",
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
    listen: ListenConfig = ListenConfig()
    upstream: UpstreamConfig
    auth: AuthConfig = AuthConfig()
    policies_dir: RelPath = Path("policies")
    staging: StagingConfig = StagingConfig()
    admission: AdmissionConfig = AdmissionConfig()
    limits: LimitsConfig = LimitsConfig()
    cors: CorsConfig = CorsConfig()
    audit: AuditConfig = AuditConfig()
    metrics: MetricsConfig = MetricsConfig()
    responses: ResponsesConfig = ResponsesConfig()
    logging: LoggingConfig = LoggingConfig()
    limits_store: LimitsStoreConfig = LimitsStoreConfig()

    @model_validator(mode="after")
    def _cross_checks(self) -> GatewayConfig:
        # base64 grows bytes by 4/3; the forwarded body must fit the worker's limit.
        media = self.limits.max_media_bytes * 4 // 3
        if self.staging.worker_media == "data_url" and media > self.upstream.max_request_bytes:
            raise ValueError(
                "limits.max_media_bytes x 4/3 exceeds upstream.max_request_bytes (data_url mode)"
            )
        return self
