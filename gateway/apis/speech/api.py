"""``POST /v1/audio/speech``: the descriptor, the request's planning and its answer.

Fields: ``model`` (an alias), ``input`` (1 to ``speech.max_input_chars``
characters: longer is ``prompt_too_large``, ``param: input``; within
``max_prompt_bytes`` too), ``response_format`` ``wav`` (default) or ``pcm``;
``voice``, ``speed`` and ``instructions`` are accepted and dropped (the
worker ignores them); ``mp3``, ``opus``, ``aac``, ``flac`` and
``stream_format: sse`` are ``unsupported_field`` naming the field and the
values served. The worker gets ``model``, ``input`` and ``response_format``.

The answer (:class:`SpeechDialect`): the worker's body is held whole (bounded
by ``speech.max_output_bytes`` as it arrives: past it, refused and nothing
more kept) and checked before the caller gets a byte
(:mod:`gateway.apis.speech.audio`); then relayed as its own bytes, as
exactly ``audio/wav`` or ``audio/pcm;rate=<hz>;channels=<n>``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

from gateway.apis.base import (
    Dialect,
    Endpoint,
    OneCall,
    Plan,
    PlanContext,
    Report,
    StreamBounds,
    check_prompt,
    require_object,
    require_text_modality,
    resolve_alias,
)
from gateway.apis.fields import Spec, harmless, invalid, obj, string, text_size, unsupported
from gateway.apis.held import HeldBody
from gateway.apis.speech.audio import Audio, Head, check_pcm, check_wav, media_type
from gateway.core.errors import GatewayError
from gateway.core.replies import Pieces
from gateway.core.sse import violation

FORMATS = ("wav", "pcm")
#: OpenAI's formats the worker cannot make (it answers 422 for them)
REFUSED_FORMATS = frozenset({"mp3", "opus", "aac", "flac"})


def _format(value: Any, path: str) -> str:
    if value in REFUSED_FORMATS:
        raise unsupported(path, "must be wav or pcm here (mp3, opus, aac and flac are not served)")
    if value not in FORMATS:
        raise invalid(path, "must be wav or pcm")
    return str(value)


def _stream_format(value: Any, path: str) -> Any:
    if value == "sse":
        raise unsupported(path, "must be audio here (sse is not served)")
    if value != "audio":
        raise invalid(path, "must be audio")
    return harmless(value, path)


FIELDS: dict[str, Spec] = {
    "model": string,
    "input": string,
    "response_format": _format,
    "stream_format": _stream_format,
    "voice": harmless,
    "speed": harmless,
    "instructions": harmless,
}
BODY = obj(FIELDS, required=("model", "input"))


@dataclass(frozen=True, slots=True)
class SpeechRequest:
    response_format: str
    max_bytes: int


class SpeechApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="speech",
        path="/v1/audio/speech",
        operation="generate_content",
        media_param="input",
        exchange="audio",
        route_kinds=frozenset({"speech"}),
        cost="speech",
        worker_rejection="relayed",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        tenant = ctx.tenant
        clean: dict[str, Any] = BODY(require_object(body), "")
        alias = resolve_alias(clean, ctx)
        text: str = clean["input"]
        if not text:
            raise invalid("input", "must not be empty")
        limit = ctx.speech.max_input_chars
        if len(text) > limit:
            raise GatewayError(
                "prompt_too_large", f"input is longer than {limit} characters.", param="input"
            )
        require_text_modality(tenant, "input")
        prompt_bytes = text_size(text)
        check_prompt(prompt_bytes, tenant, "input")
        fmt = clean.get("response_format", "wav")
        return Plan(
            endpoint=self.endpoint.name,
            alias=alias,
            body={"input": text, "response_format": fmt},
            stream=False,
            include_usage=False,
            max_tokens=None,
            prompt_bytes=prompt_bytes,
            nonce=ctx.nonce,
            bills_tokens=False,
            detail=SpeechRequest(fmt, ctx.speech.max_output_bytes),
        )

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        return {"model": route, **plan.body}

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return SpeechDialect(plan.detail)


class AudioBody(HeldBody):
    """The worker's audio as a sans-I/O source: its head's media type, then
    bytes (bounded, held once), then the whole body as one item and
    :class:`~gateway.core.sse.Done`."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, what="audio")
        self.head = Head("")

    def receive_head(self, content_type: bytes) -> None:
        self.head = media_type(content_type)


class SpeechDialect(OneCall):
    """The worker's audio body, checked whole, relayed as its own bytes."""

    terminal_frame = b""
    usage_source = "reported"
    #: audio is not a stream of content events: no first token (ttft) is measured
    has_content = False

    def __init__(self, request: SpeechRequest) -> None:
        self._request = request
        self._source = AudioBody(request.max_bytes)
        self._body: bytes | None = None
        self._audio: Audio | None = None
        self._sha256: str | None = None

    @property
    def source(self) -> AudioBody:
        return self._source

    def on_item(self, body: bytes) -> bytes | None:
        head, fmt = self._source.head, self._request.response_format
        if head.media_type != f"audio/{fmt}":
            raise violation(f"Upstream audio is not {fmt}.")
        audio = check_wav(body, head) if fmt == "wav" else check_pcm(len(body), head)
        self._body, self._audio = body, audio
        self._sha256 = hashlib.sha256(body).hexdigest()
        return None

    def error_frame(self, exc: GatewayError) -> bytes:
        raise AssertionError("a speech answer is never streamed")

    def report(self) -> Report:
        audio, body = self._audio, self._body
        if audio is None or body is None or self._sha256 is None:
            return Report()
        ms = audio.duration_ms
        return Report(
            outputs=[{"sha256": self._sha256, "bytes": len(body), "duration_ms": ms}],
            media_usage={"audio_ms": ms},
        )

    def answer(self, usage: dict[str, Any]) -> Pieces:
        """The body as the worker made it, under exactly the caller's media type."""
        audio, body = self._audio, self._body
        assert audio is not None and body is not None
        if self._request.response_format == "wav":
            return Pieces(b"audio/wav", (body,))
        kind = b"audio/pcm;rate=%d;channels=%d" % (audio.rate, audio.channels)
        return Pieces(kind, (body,))
