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
    certfile: RelPath
    keyfile: RelPath
    client_ca: RelPath | None = None


class ListenConfig(Model):
    host: str = "0.0.0.0"
    port: Annotated[int, Field(ge=0, le=65535)] = 8443
    tls: TLSConfig | None = None
    shutdown_grace_s: Annotated[float, Field(ge=0)] = 30
    # Not in the spec's example (added for hostile clients, see docs/security.md):
    # a request head must arrive within header_timeout_s of its first byte (or of
    # the connection), a body within body_timeout_s of its head.
    header_timeout_s: Annotated[float, Field(gt=0, le=300)] = 10
    body_timeout_s: Annotated[float, Field(gt=0, le=3600)] = 30
    max_header_bytes: Annotated[int, Field(ge=4096, le=1_048_576)] = 32_768


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

    model_public_id: str
    model_revision: Annotated[str, Field(min_length=1)]
    model_bundle_sha256: Hex64
    model_dir: str
    format: Literal["plain", "gguf", "ggml"] = "plain"
    #: gguf/ggml: the model file's name inside model_dir (``-f``)
    quantized_file: str | None = None
    kind: Literal["auto", "text", "multimodal", "embedding"] = "auto"

    @model_validator(mode="after")
    def _checks(self) -> ModelLaunch:
        _digest_addressed(self.model_dir, self.model_bundle_sha256)
        _quantized_file(self.format, self.quantized_file)
        return self


class LaunchConfig(Model):
    """The pinned worker (spec §11, §12 "Launch contract", §16).

    One model (``model_*`` fields, ``mistralrs serve``), or several
    (``models``, ``mistralrs from-config`` with a generated TOML file)."""

    version: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")]
    binary_sha256: Hex64
    model_public_id: str | None = None
    model_revision: Annotated[str, Field(min_length=1)] | None = None
    model_bundle_sha256: Hex64 | None = None
    model_dir: str | None = None
    format: Literal["plain", "gguf", "ggml"] = "plain"
    #: gguf/ggml: the model file's name inside model_dir (``-f/--quantized-file``)
    quantized_file: str | None = None
    #: a multi-model worker's models, each served under its model_dir
    models: list[ModelLaunch] | None = None
    #: where the pod mounts the generated from-config TOML (multi-model only;
    #: default /etc/mistralrs/models.toml)
    config_path: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] = 1234
    max_seqs: PositiveInt = 8
    max_seq_len: PositiveInt = 4096
    max_batch_size: PositiveInt = 1
    paged_attn: Literal["auto", "on", "off"] = "auto"
    prefix_cache_n: Annotated[int, Field(ge=0)] = 16
    max_num_images: PositiveInt = 8
    max_edge: PositiveInt = 1024
    device: Literal["cpu", "cuda", "metal"] = "cpu"

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
    """Semantic readiness (spec §16): a one-token request through the full validator."""

    #: what the route serves: a streamed chat completion, or an embedding
    kind: Literal["chat", "embeddings"] = "chat"
    max_tokens: Annotated[int, Field(ge=1, le=16)] = 1
    timeout_s: PositiveFloat = 30
    prompt: Annotated[str, Field(min_length=1, max_length=256)] = "ping"


UPSTREAM_NAME = r"^[a-z0-9-]{1,32}$"


class UpstreamConfig(Model):
    """One worker. ``upstream:`` (one worker, named ``default``, one ``route``)
    or each entry of ``upstreams:`` (``name`` and ``routes``)."""

    name: Annotated[str, Field(pattern=UPSTREAM_NAME)] = "default"
    base_url: str = "http://127.0.0.1:1234"
    allow_remote: bool = False
    #: the one route of the ``upstream:`` shorthand
    route: Annotated[str, Field(min_length=1)] | None = None
    #: the exact routes this worker serves
    routes: list[Annotated[str, Field(min_length=1)]] = []
    #: this worker's admission permits (default: admission.capacity)
    capacity: PositiveInt | None = None
    probe: ProbeConfig | None = None
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
    issuer: Annotated[str, Field(min_length=1)]
    audience: Annotated[str, Field(min_length=1)]
    algorithms: Annotated[list[str], Field(min_length=1)]
    jwks_file: RelPath | None = None
    jwks_url: str | None = None
    hs256_secret_env: str | None = None
    tenant_claim: str = "tenant"
    scope_claim: str = "scope"
    leeway_s: Annotated[float, Field(ge=0)] = 30
    max_lifetime_s: PositiveFloat = 3600
    jwks_refresh_min_s: Annotated[float, Field(ge=0)] = 2
    jwks_max_bytes: PositiveInt = 1_048_576

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
    issuers: list[IssuerConfig] = []

    @field_validator("issuers")
    @classmethod
    def _unique(cls, value: list[IssuerConfig]) -> list[IssuerConfig]:
        names = [i.issuer for i in value]
        if len(names) != len(set(names)):
            raise ValueError("issuer values must be unique")
        return value


class StagingConfig(Model):
    dir: RelPath = Path("var/evidence")
    catalog: RelPath = Path("var/catalog.sqlite3")
    worker_media: Literal["data_url", "file_url"] = "data_url"
    worker_url_prefix: str | None = None
    #: uploads read at once (each streams to a temp file); the next gets 429 queue_full
    max_concurrent_uploads: PositiveInt = 4
    #: how often records past a tenant's evidence.ttl_s are forgotten
    expiry_sweep_s: PositiveFloat = 30

    @model_validator(mode="after")
    def _prefix_for_file_url(self) -> StagingConfig:
        prefix = self.worker_url_prefix or ""
        if self.worker_media == "file_url" and not prefix.startswith("file:///"):
            raise ValueError("file_url mode needs worker_url_prefix: file:///<dir>")
        return self


class AdmissionConfig(Model):
    capacity: PositiveInt = 8
    max_queue: Annotated[int, Field(ge=0)] = 64


class LimitsConfig(Model):
    max_body_bytes: PositiveInt = 1_048_576
    max_prompt_bytes: PositiveInt = 65_536
    max_media_parts: Annotated[int, Field(ge=0)] = 8
    max_media_bytes: PositiveInt = 36_700_160
    max_output_tokens: PositiveInt = 4096
    max_json_depth: PositiveInt = 32
    #: inputs in one embeddings request (spec §14)
    max_embedding_inputs: PositiveInt = 256


_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?$")


class CorsConfig(Model):
    allow_origins: list[str] = []
    max_age_s: Annotated[int, Field(ge=0)] = 600

    @field_validator("allow_origins")
    @classmethod
    def _exact(cls, value: list[str]) -> list[str]:
        bad = [o for o in value if not _ORIGIN.match(o)]
        if bad:
            raise ValueError("each origin must be exact scheme://host[:port] (no '*', no path)")
        return value


class AuditConfig(Model):
    path: RelPath = Path("receipts.jsonl")
    #: receipts kept in memory while the file cannot be written (spec §13)
    max_pending: PositiveInt = 100_000
    #: how long a drain waits for the writer
    flush_timeout_s: Annotated[float, Field(ge=0)] = 5
    #: rotate to <path>.1 … <path>.<keep> before the file passes this size (0: off)
    rotate_bytes: Annotated[int, Field(ge=0)] = 0
    keep: Annotated[int, Field(ge=0, le=1000)] = 10


class MetricsListen(Model):
    host: str = "0.0.0.0"
    port: Annotated[int, Field(ge=0, le=65535)] = 9464


class MetricsConfig(Model):
    path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9/_-]*$")] = "/metrics"
    #: serve metrics on this plain-HTTP listener instead of the main one (spec §13)
    listen: MetricsListen | None = None


class ResponsesConfig(Model):
    #: how long a relayed Responses id stays the tenant's (previous_response_id, GET, DELETE)
    ttl_s: PositiveInt = 86_400


class LoggingConfig(Model):
    level: Literal["debug", "info", "warning", "error"] = "info"


class LimitsStoreConfig(Model):
    """Where tenant rate limits live (spec §15): this process, or a shared Redis."""

    backend: Literal["memory", "redis"] = "memory"
    url: str = "redis://127.0.0.1:6379/0"
    #: the environment variable holding the password (never the password itself)
    password_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] | None = None
    key_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9:._-]{0,64}$")] = "mrgw:"
    timeout_ms: Annotated[int, Field(ge=1, le=60_000)] = 50
    on_error: Literal["closed", "open"] = "closed"

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
    #: one worker (the shorthand, named ``default``) ...
    upstream: UpstreamConfig | None = None
    #: ... or several (spec §16)
    upstreams: list[UpstreamConfig] | None = None
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
