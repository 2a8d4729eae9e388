"""What every endpoint descriptor shares: the plan, the media refs, the dialect seam.

One pipeline serves every inference endpoint (``gateway/pipeline``); an
:class:`Api` descriptor owns only what differs between them, the way a
starlette ``Route`` carries what differs per path:

- its :class:`Endpoint`: path, scope and endpoint name (policy, receipts,
  metrics), the worker's path and exchange, the error shape, the route kinds
  it runs on (spec §23) and what its permits cost;
- :meth:`Api.plan`: the field allowlist and the planning of one request
  (alias, output bound, prompt bytes, media parts as :class:`MediaRef`, and
  how many worker calls it makes: :attr:`Plan.calls`, one per image asked for);
- :meth:`Api.forward`: the body the worker gets (alias → exact route,
  stream forced, usage asked for, ``max_tokens`` explicit), media still as
  placeholders that only the gateway can fill (``gateway/core/body.py``);
- :meth:`Api.dialect`: the worker's answer as a sans-I/O :class:`Dialect`
  (its stream grammar or JSON check, the caller's frames, the non-stream
  answer and where its usage lives). One dialect reads every worker call of a
  request: before each call after the first the pipeline asks it for a fresh
  source (:meth:`Dialect.next_call`), and its answer assembles them all.

Pure: no I/O library is imported here or by any descriptor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from mypy_extensions import mypyc_attr

from gateway.apis.agents.events import AgentEvents
from gateway.config.agents import RouteAgents
from gateway.config.media import ImagesConfig, SpeechConfig
from gateway.config.policy import Tenant
from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces
from gateway.core.sse import NEED_DATA, Done, Framing, KeepAlive, violation

MediaKind = Literal["image", "audio", "video"]
TextNul = Literal["replace", "pass", "reject"]


def _no_agents(route: str) -> RouteAgents | None:
    return None


@dataclass(frozen=True, slots=True)
class PlanContext:
    """What planning may know beyond the body: the tenant and a per-request
    nonce for media placeholders (callers cannot guess it)."""

    tenant: Tenant
    nonce: str
    #: the request's header fields (lower-case names), for descriptors that read them
    headers: tuple[tuple[bytes, bytes], ...] = ()
    #: the gateway's image and speech bounds, and its public base URL (spec §23)
    images: ImagesConfig = field(default_factory=ImagesConfig)
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    public_base_url: str | None = None
    #: the ``agents`` of the worker a policy route reaches (spec §22); None: none
    route_agents: Callable[[str], RouteAgents | None] = _no_agents
    #: the key of the worker's session ids (gateway ``agents.session_key_env``)
    session_key: bytes = b""

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def aliases(self) -> Mapping[str, str]:
        return self.tenant.policy.models


@dataclass(frozen=True, slots=True)
class MediaRef:
    """One media part of the request, in request order."""

    slot: int  # index in Plan.media; the body holds placeholder(nonce, slot) for its URL
    flat_index: int  # index in the flattened sequence of content parts
    kind: MediaKind  # what the part claims to be (image_url → image, …)
    source: Literal["evidence", "data"]
    evidence_id: str | None = None
    data_url: str | None = None  # inline data to stage (source "data")
    inline_bytes: int = 0  # decoded size of inline data, known before decoding


@dataclass(slots=True)
class Plan:
    """One validated request: what the pipeline needs to bound, admit and forward it."""

    endpoint: str
    alias: str
    body: dict[str, Any]  # the caller's fields to forward; media URLs as placeholders
    stream: bool  # what the caller asked for
    include_usage: bool
    max_tokens: int | None  # the output bound (None where the endpoint generates none)
    prompt_bytes: int  # every text the worker will tokenize or compile
    nonce: str
    tools_requested: bool = False
    media: list[MediaRef] = field(default_factory=list)
    dropped_parts: list[int] = field(default_factory=list)
    #: endpoint-specific facts the pipeline hands back to the descriptor (e.g.
    #: a Responses ``previous_response_id`` to check against the catalog)
    previous_response_id: str | None = None
    #: whether the request spends tokens (reserved and settled); a token count does not
    bills_tokens: bool = True
    #: messages or inputs the worker templates (4 tokens of overhead each, spec §21)
    turns: int = 1
    #: the caller sees every usage field the worker reported (policy
    #: ``usage_details: full``), not only the counts (spec §21)
    full_usage: bool = False
    #: worker calls the request makes, one after the other, each with its own
    #: permit and counted as a request (an image each, spec §23)
    calls: int = 1
    #: what the descriptor hands its dialect from planning (an image request's
    #: size, count and format; a speech request's format and bound)
    detail: Any = None
    #: an agentic request (spec §22): what the worker's tool loop may do
    agent: AgentPlan | None = None
    #: the caller streams and asked for the agent's events (``x-agent-events: 1``)
    agent_events: bool = False


class AgentPlan(Protocol):
    """An agentic request as planning left it (``gateway.apis.agents.AgentRequest``)."""

    @property
    def rounds(self) -> int:
        """The forwarded (clamped) ``max_tool_rounds``."""
        ...

    @property
    def tools(self) -> frozenset[str]: ...

    @property
    def worker_session_id(self) -> str: ...

    @property
    def caller_session_id(self) -> str | None: ...

    def apply(self, worker_body: Mapping[str, Any]) -> dict[str, Any]:
        """The worker's chat request with the agentic fields set."""
        ...


@dataclass(frozen=True, slots=True)
class StreamBounds:
    """What one worker answer may hold (from the upstream's config)."""

    framing: Framing = field(default_factory=Framing)
    max_text_bytes: int = 16_777_216
    text_nul: TextNul = "replace"
    #: the most prompt tokens the worker may bill (spec §21): a token is at least
    #: one byte of what was forwarded; None: unchecked (the readiness probe)
    max_prompt_tokens: int | None = None
    #: an agentic stream's event machine (spec §22), shared with the pipeline's
    #: agent run: its events are read beside the chunks
    agent: AgentEvents | None = None


class OutputText:
    """The output text of one stream, field by field: NUL under the route's
    ``text_nul`` rule (spec §14), UTF-8 bytes counted against one bound. ``what``
    names the stream's unit in a fault's message ("chunk", "event")."""

    __slots__ = ("_max_bytes", "_text_nul", "_what", "bytes", "nul_replaced")

    def __init__(self, max_bytes: int, text_nul: TextNul, what: str) -> None:
        self._max_bytes = max_bytes
        self._text_nul = text_nul
        self._what = what
        self.bytes = 0
        self.nul_replaced = 0

    def _utf8_length(self, value: str) -> int:
        try:
            return len(value.encode("utf-8"))
        except UnicodeEncodeError:
            pass
        # A lone surrogate escape (\ud800) decodes but cannot be re-sent. Raised
        # outside the handler: the encode error holds the text (model output).
        raise violation(f"Upstream {self._what} text is not valid Unicode.")

    def scrub(self, value: str) -> str:
        """``value``, which holds NUL, under the ``text_nul`` rule."""
        if self._text_nul == "reject":
            raise violation(f"Upstream {self._what} text contains NUL.")
        if self._text_nul == "replace":
            # Real models emit U+0000 through byte-fallback tokens (spec §14).
            self.nul_replaced += value.count("\x00")
            return value.replace("\x00", "\ufffd")
        return value

    def count(self, value: str) -> None:
        if value.isascii():
            self.bytes += len(value)
        else:
            self.bytes += self._utf8_length(value)
        if self.bytes > self._max_bytes:
            raise violation("Upstream stream exceeded the text size limit.")


@dataclass(slots=True)
class Report:
    """What a dialect observed, for the receipt, metrics and rate settlement."""

    finish_reason: str | None = None
    #: the worker's usage object as it sent it (every field), if it sent one
    usage: dict[str, Any] | None = None
    #: (prompt, completion, total) read from ``usage``
    counts: tuple[int, int, int] | None = None
    #: completion tokens estimated from what arrived, for when usage is missing
    output_estimate: int = 0
    #: the receipt outcome once the answer ended validly
    outcome: str = "complete"
    nul_replaced: int = 0
    #: ids the worker gave the answer (Responses: recorded for the tenant)
    response_id: str | None = None
    #: the worker's own id of the answer (the receipt's ``upstream_id``, spec §21)
    upstream_id: str | None = None
    #: the answer's final object when it is kept for a later GET (Responses)
    final: dict[str, Any] | None = None
    #: what a media answer made (spec §23): the receipt's ``outputs`` and its usage
    #: (``{"images": n}`` or ``{"audio_ms": ms}``) instead of token counts
    outputs: list[dict[str, int | str]] | None = None
    media_usage: dict[str, int] | None = None
    #: outputs the pipeline stores as tenant files before the answer (``url`` images)
    files: Sequence[OutputFile] = ()


@dataclass(eq=False, slots=True)
class OutputFile:
    """One output to keep as a tenant file (spec §23 ``url``): the dialect fills
    the bytes (or their pieces, read once, as the file is written), the pipeline
    stores them and hands back their link in ``url``."""

    data: bytes | Iterable[bytes]
    name: str
    url: str | None = None


class Source(Protocol):
    """The sans-I/O reader of one worker answer (``sse.StreamValidator`` or a
    JSON body): bytes in, items out."""

    @property
    def bytes_received(self) -> int: ...

    def receive_data(self, data: bytes) -> None: ...

    def next_event(self) -> Any: ...


class HeadReader(Protocol):
    """A source that also reads the worker's response head (its media type,
    checked by the transport for the exchange): a binary body's format may
    live there alone (``audio/pcm;rate=…``)."""

    def receive_head(self, content_type: bytes) -> None: ...


class Dialect(Protocol):
    """One worker answer as one endpoint reads it; pure, built per request.

    ``on_item`` gets every item the source yields (not keep-alives or the
    end) and returns the caller's frame for it, or None (non-stream callers,
    or nothing to show). ``has_content`` turns true with the first content
    (time to first token)."""

    @property
    def has_content(self) -> bool: ...

    @property
    def terminal_frame(self) -> bytes:
        """What ends a valid stream for the caller (``data: [DONE]``); unused for JSON."""
        ...

    #: where a stream's usage will come from (the ``x-usage-source`` header,
    #: sent before the usage is known): ``reported`` or ``estimated``
    usage_source: str

    @property
    def source(self) -> Source: ...

    def on_item(self, item: Any) -> bytes | None: ...

    def error_frame(self, exc: GatewayError) -> bytes: ...

    def answer(self, usage: dict[str, Any]) -> dict[str, Any] | Pieces:
        """The non-streaming caller's answer, with the usage the pipeline settled:
        a JSON object, or a body already in pieces (images, audio)."""
        ...

    def report(self) -> Report: ...

    def next_call(self) -> None:
        """Before the next worker call of a plan that makes several: a fresh
        source; what earlier calls produced stays for the answer."""
        ...


#: what :func:`pump` stopped at (flags): events completed in this call, the
#: first content is there now, the actor must act, the answer ended validly
PROGRESSED, CONTENT, ACT, DONE = 1, 2, 4, 8
#: a keep-alive, as the caller gets it
KEEPALIVE_FRAME = b":\n\n"


def pump(
    dialect: Dialect,
    out: list[bytes],
    streaming: bool,
    watch_content: bool,
    note: Callable[[Any], bool] | None,
) -> int:
    """The relay's per-event loop (``pipeline/relay.py``), compiled with the
    core: every event the dialect's source has now, each item's frame (and a
    streaming caller's keep-alives) appended to ``out``. Returns the flags
    above when the source needs data, at the answer's valid end (:data:`DONE`
    alone), right after the item that gave the dialect its first content
    when ``watch_content`` (:data:`CONTENT`: the relay notes the time and
    calls again), and after an item ``note`` says needs the actor
    (:data:`ACT`). A :class:`GatewayError` propagates with ``out`` holding
    the frames of every item before it."""
    source = dialect.source
    status = 0
    while True:
        event = source.next_event()
        if event is NEED_DATA:
            return status
        if isinstance(event, Done):
            return DONE
        status = PROGRESSED
        if isinstance(event, KeepAlive):
            if streaming:
                out.append(KEEPALIVE_FRAME)
            continue
        frame = dialect.on_item(event)
        if watch_content and dialect.has_content:
            status |= CONTENT
        if frame is not None:
            out.append(frame)
        if note is not None and note(event):
            # The worker waits for the gateway: act before reading on.
            return status | ACT
        if status & CONTENT:
            return status


# Compiled (gateway/native.py), a class is closed to Python subclasses unless it says so.
@mypyc_attr(allow_interpreted_subclasses=True)
class OneCall:
    """What a dialect of a one-call plan says when asked for another (never)."""

    __slots__ = ()

    def next_call(self) -> None:
        raise AssertionError("this endpoint makes one worker call per request")


#: what a worker exchange is: an SSE stream, one JSON body, or one audio body
Exchange = Literal["sse", "json", "audio"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """What names one endpoint, for the edge, the policy, receipts and metrics."""

    #: the receipt's and the metrics' endpoint name
    name: str
    path: str
    #: the OpenTelemetry GenAI ``gen_ai.operation.name`` of a call to it
    operation: str
    #: the request field a media refusal names as its ``param``
    media_param: str
    #: where the worker is asked (``path`` unless the gateway translates the dialect)
    upstream_path: str = ""
    #: the endpoint name policies allow (``name`` unless several paths share one)
    policy_endpoint: str = ""
    #: the shape of error bodies on this path
    error_shape: Literal["openai", "anthropic"] = "openai"
    scope: str = "inference"
    #: what the gateway asks the worker for: an SSE stream, one JSON body, or audio
    exchange: Exchange = "sse"
    #: the route kinds it may run on (spec §23); another is ``model_not_capable``
    route_kinds: frozenset[str] = frozenset({"chat"})
    #: what each worker call's permit weighs: the request's base and media parts,
    #: or the policy's ``cost.image_generation`` / ``cost.speech`` (spec §23)
    cost: Literal["request", "image_generation", "speech"] = "request"
    #: a worker's 4xx: ``upstream_rejected`` (spec §12), or ``invalid_request``
    #: with the worker's own message cut to 200 characters (spec §24, media routes)
    worker_rejection: Literal["classified", "relayed"] = "classified"
    #: whether the worker may run its own tools for this path (spec §22):
    #: ``governed`` (the gateway reads the agentic events and approves every call),
    #: ``ungoverned`` (the worker would run them unasked), ``none``
    tool_loop: Literal["none", "governed", "ungoverned"] = "none"

    def __post_init__(self) -> None:
        if not self.upstream_path:
            object.__setattr__(self, "upstream_path", self.path)
        if not self.policy_endpoint:
            object.__setattr__(self, "policy_endpoint", self.name)


class Api(Protocol):
    """An endpoint descriptor; see the module docstring."""

    @property
    def endpoint(self) -> Endpoint:
        """The descriptor's, read from its class too (a ``ClassVar`` there: a
        compiled class keeps an instance attribute off the class)."""
        ...

    def plan(self, body: Any, ctx: PlanContext) -> Plan: ...

    def forward(self, plan: Plan, route: str) -> dict[str, Any]: ...

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect: ...


# -- planning pieces the descriptors share ------------------------------------


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise GatewayError("invalid_request", "The request body must be a JSON object.")
    return body


def resolve_alias(body: Mapping[str, Any], ctx: PlanContext) -> str:
    alias = body.get("model")
    if not isinstance(alias, str):
        raise GatewayError("invalid_request", "model is required.", param="model")
    if alias not in ctx.aliases:
        raise GatewayError("model_not_found", param="model")
    return alias


def output_bound(body: Mapping[str, Any], tenant: Tenant, names: tuple[str, ...]) -> int:
    """The request's output bound: the named fields must agree and stay within
    the tenant's limit; absent means the limit."""
    limit = tenant.limits.max_output_tokens
    given = [(name, body[name]) for name in names if body.get(name) is not None]
    if not given:
        return limit
    for name, given_value in given:
        if type(given_value) is not int or given_value < 1:
            raise GatewayError("invalid_request", f"{name} must be a positive integer.", param=name)
    if len({v for _, v in given}) > 1:
        raise GatewayError("invalid_request", f"{' and '.join(names)} differ.", param=given[-1][0])
    value = int(given[0][1])
    if value > limit:
        raise GatewayError(
            "output_tokens_exceeded",
            f"{given[0][0]} exceeds this tenant's limit of {limit}.",
            param=given[0][0],
        )
    return value


def stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage) as the caller asked; types already checked."""
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    return stream, options.get("include_usage") is True


def check_prompt(prompt_bytes: int, tenant: Tenant, param: str) -> None:
    """``max_prompt_bytes``; ``param`` names the field to shorten (spec §24)."""
    if prompt_bytes > tenant.limits.max_prompt_bytes:
        raise GatewayError(
            "prompt_too_large", "The prompt exceeds this tenant's limit.", param=param
        )


def require_text_modality(tenant: Tenant, param: str) -> None:
    """Text is a modality like the others (spec §13)."""
    if not tenant.allows_modality("text"):
        raise GatewayError("modality_not_allowed", "The text modality is not allowed.", param=param)
