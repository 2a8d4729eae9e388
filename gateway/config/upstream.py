"""One worker the gateway forwards to: :class:`UpstreamConfig` (its origin, routes,
timeouts, the bounds its answers are read under, and optionally its pinned
launch), its readiness :class:`ProbeConfig`, the pattern of worker names
(:data:`UPSTREAM_NAME`) and :func:`is_loopback_host`, which decides whether an
origin needs ``allow_remote``.

Each route has a kind (spec §23, :data:`RouteKind`): what the model behind it
serves. A route is written as its name (kind ``chat``: every config written
before kinds keeps its meaning) or as ``{route, kind}`` (:class:`RouteEntry`).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.agents import RouteAgents
from gateway.config.base import Model, PositiveFloat, PositiveInt
from gateway.config.launch import LaunchConfig
from gateway.core.sse import Framing


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


class ConfirmCancelConfig(Model):
    """Canceled requests keep their permits until the worker's metrics confirm
    the sequence is gone (spec §20), so admission does not overcommit while
    the worker is still busy with them."""

    metrics_path: Annotated[str, Field(pattern=r"^/[A-Za-z0-9/._-]{0,255}$")] | None = Field(
        "/metrics",
        description=(
            "The worker's Prometheus path (mistral.rs >= 0.9.2); null: no confirmation "
            "(permits go back when the connection closes)."
        ),
    )
    timeout_s: PositiveFloat = Field(
        10, description="Longest hold of a canceled request's permits; then they go anyway."
    )


UPSTREAM_NAME = r"^[a-z0-9-]{1,32}$"

#: what a route's model serves (spec §23): a text or multimodal chat model,
#: an embedding model, a speech model (``serve speech``) or a diffusion model
#: (``serve diffusion``)
RouteKind = Literal["chat", "embeddings", "speech", "image"]
#: the kinds a semantic readiness probe can ask (spec §23: none for the others)
PROBED_KINDS: frozenset[str] = frozenset({"chat", "embeddings"})


class RouteEntry(Model):
    """A route with its kind; a bare string is ``{route: <it>, kind: chat}``."""

    route: Annotated[str, Field(min_length=1)] = Field(
        description="The exact route (the worker's model id)."
    )
    kind: RouteKind = Field("chat", description="What the route's model serves.")


RouteSpec = Annotated[str, Field(min_length=1)] | RouteEntry


def _name(spec: RouteSpec) -> str:
    return spec if isinstance(spec, str) else spec.route


def _kind(spec: RouteSpec) -> RouteKind:
    return "chat" if isinstance(spec, str) else spec.kind


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
    route: RouteSpec | None = Field(
        None,
        description=(
            "`upstream:` only: the one route (the worker's model id) the aliases may point at; "
            "a name (kind chat) or `{route, kind}`."
        ),
    )
    routes: list[RouteSpec] = Field(
        [],
        description=(
            "`upstreams:` entries: the exact routes this worker serves, each a name (kind "
            "chat) or `{route, kind}` with kind chat, embeddings, speech or image (spec §23)."
        ),
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
    confirm_cancel: ConfirmCancelConfig = Field(
        default_factory=ConfirmCancelConfig,
        description="Hold a canceled request's permits until the worker confirms (spec §20).",
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
        600, description="A whole worker exchange; also sizes token holds and evidence leases."
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
    agents: RouteAgents | None = Field(
        None,
        description=(
            "The tools this worker runs for tenants (spec §22); absent: no agentic flag is "
            "launched and agentic requests to its routes are refused."
        ),
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
            media = {"speech", "image"} & set(self.route_kinds.values())
            if media and self.launch.models is not None:
                # from-config's model kinds are text, multimodal and embedding only.
                raise ValueError(
                    "a speech or image route needs a one-model launch "
                    "(`mistralrs serve speech|diffusion`)"
                )
            if media and self.launch.format != "plain":
                raise ValueError("a speech or image route's launch takes format plain")
            if self.agents is not None and self.launch.models is not None:
                raise ValueError("agents need a one-model launch (`mistralrs serve`)")
        if self.agents is not None and {"speech", "image"} & set(self.route_kinds.values()):
            raise ValueError("agents need chat routes (a speech or image route runs no tools)")
        return self

    @property
    def served_routes(self) -> list[str]:
        specs = [self.route] if self.route is not None else self.routes
        return [_name(spec) for spec in specs]

    @property
    def route_kinds(self) -> dict[str, RouteKind]:
        """Route -> its kind (spec §23)."""
        specs = [self.route] if self.route is not None else self.routes
        return {_name(spec): _kind(spec) for spec in specs}

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
