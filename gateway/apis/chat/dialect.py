"""The chat and text-completion chunk dialect (spec §8, §12, §14). Pure.

:class:`ChunkDialect` reads the worker's stream with the chunk grammar
(``chunk_grammar``) and turns the validated chunks into the caller's frames
(model set back to the alias, usage removed unless asked for) or, for a
non-streaming caller, collects them into the answer the worker would have
given non-streamed (``chunk_answer``).

Ids are the gateway's (``apis/ids.py``): the answer's, and every tool call's
(``call_`` and 96 random bits, ``toolu_`` for the Messages dialect that
shows these chunks; one replacement per worker id within the answer),
swapped in the chunk before it is framed or collected.

Usage: chat's worker reports it on the terminal chunk; the completions
worker never does (reference §3.5), so a completion's usage is counted from
the content chunks received (``usage.count_output_tokens``) and, when the
caller asked for ``stream_options.include_usage``, the dialect adds the
usage chunk the worker did not send: ``choices: []``, the stream's id,
created and model, the estimated usage, right before ``data: [DONE]`` (the
:attr:`ChunkDialect.terminal_frame` of a stream that ended validly).
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from gateway.apis.base import OneCall, Plan, Report, StreamBounds
from gateway.apis.chat.agentic import ChunkSource, agent_source
from gateway.apis.chat.answer import RUST_WHITESPACE, CollectedAnswer, answer_logprob
from gateway.apis.chat.grammar import (
    DONE_FRAME,
    Chunk,
    SSEValidator,
    StreamRules,
    StreamState,
)
from gateway.apis.chat.plain import text_parts
from gateway.apis.ids import InnerIds, gateway_id
from gateway.apis.usage import (
    count_output_tokens,
    counts_only,
    estimate_output_tokens,
    public_usage,
    usage_of,
)
from gateway.core.errors import GatewayError

# Re-exported for the tests and benchmarks that import them from here.
__all__ = [
    "RUST_WHITESPACE",
    "Chunk",
    "ChunkDialect",
    "SSEValidator",
    "StreamRules",
    "StreamState",
    "answer_logprob",
]


class ChunkDialect(OneCall):
    """One chat or completion answer, for a streaming or a non-streaming caller."""

    def __init__(
        self,
        kind: Literal["chat", "completion"],
        plan: Plan,
        bounds: StreamBounds,
        *,
        collect: bool,
        call_prefix: str = "call_",
    ) -> None:
        framing = bounds.framing
        agent = bounds.agent
        # An agentic answer sums every round's usage (spec §24): its bounds are
        # the request's times the rounds it may run, plus the answer's own.
        times = 1 if agent is None else agent.limits.max_tool_rounds + 1
        rules = StreamRules(
            kind=kind,
            max_tokens=None if plan.max_tokens is None else plan.max_tokens * times,
            max_prompt_tokens=(
                None if bounds.max_prompt_tokens is None else bounds.max_prompt_tokens * times
            ),
            tools_requested=plan.tools_requested,
            max_line_bytes=framing.max_line_bytes,
            max_event_bytes=framing.max_event_bytes,
            max_stream_bytes=framing.max_stream_bytes,
            max_events=framing.max_events,
            max_text_bytes=bounds.max_text_bytes,
            text_nul=bounds.text_nul,
            loads=orjson.loads,
        )
        self.validator: ChunkSource = (
            SSEValidator(rules) if agent is None else agent_source(rules, agent)
        )
        self.source = self.validator
        self.kind = kind
        # Completion chunks never carry usage (reference §3.5): it is estimated.
        # (The header goes out before the body, so the request decides it.)
        self.usage_source = "reported" if kind == "chat" else "estimated"
        self.alias = plan.alias
        # The gateway's own id (spec §21): the worker's counts its requests.
        self.id = gateway_id("chatcmpl-" if kind == "chat" else "cmpl-")
        #: the worker's tool call ids -> the gateway's (made with the first call)
        self.inner: InnerIds | None = None
        self.call_prefix = call_prefix
        self.full_usage = plan.full_usage
        self.include_usage = plan.include_usage
        self.max_tokens = plan.max_tokens
        self.prompt_bytes = plan.prompt_bytes
        # What ends a valid stream; on_item puts the estimated usage chunk
        # before [DONE] once the finish shows the worker sent no usage.
        self.terminal_frame = DONE_FRAME
        self.collect = collect
        self.has_content = False
        self.content_chunks = 0
        # Only a non-streaming caller needs the text kept: its answer is
        # assembled at the end. A streaming caller needs frames only.
        self.collected = CollectedAnswer(kind, plan.alias, plan.body)
        #: the plain chunk template the frame parts below were made for
        self._spliced: dict[str, Any] | None = None
        self._head = self._tail = b""

    def observe(self, chunk: Chunk) -> None:
        """Count a validated chunk (and keep it for a non-streaming caller's
        answer) without framing it: another dialect may show it its own way."""
        if chunk.text or chunk.finish_reason:
            self.has_content = True
        if chunk.text:
            self.content_chunks += 1
        if chunk.tool_calls is not None:
            self._own_call_ids(chunk.tool_calls)
        if self.collect:
            self.collected.note(chunk)

    def _own_call_ids(self, calls: Any) -> None:
        """The worker's tool call ids in this chunk, the gateway's from now on."""
        if isinstance(calls, list):
            inner = self.inner
            if inner is None:
                inner = self.inner = InnerIds()
            for call in calls:
                inner.swap_key(call, "id", self.call_prefix)

    def on_item(self, chunk: Chunk) -> bytes | None:
        self.observe(chunk)
        if self.collect:
            return None
        template = chunk.template
        if template is not None:
            frame = self._plain_frame(template, chunk.text)
            if frame is not None:
                return frame
        data = chunk.data
        data["id"] = self.id
        data["model"] = self.alias
        if not self.include_usage:
            data.pop("usage", None)
        elif chunk.finish_reason is not None or chunk.usage is not None:
            if chunk.usage is not None and not self.full_usage:
                data["usage"] = counts_only(chunk.usage)
            # After the finish no content may follow (only a usage-only chunk,
            # which is reported usage): the estimate is final here.
            self.terminal_frame = self._usage_frame(data) + DONE_FRAME
        return b"data: " + orjson.dumps(data) + b"\n\n"

    def _plain_frame(self, template: dict[str, Any], text: str) -> bytes | None:
        """A plain chunk's frame (``plain.py``): its text spliced into the
        frame of its template edited as :meth:`on_item` edits a chunk, the
        same bytes as ``orjson.dumps`` of the edited chunk. None: frame it from
        its data."""
        if template is not self._spliced:
            data = dict(template)
            data["id"] = self.id
            data["model"] = self.alias
            if not self.include_usage:
                data.pop("usage", None)
            parts = text_parts(data, self.kind == "chat")
            if parts is None:
                return None
            self._spliced = template
            self._head = b"data: " + parts[0].encode()
            self._tail = parts[1].encode() + b"\n\n"
        return self._head + text.encode() + self._tail

    def _usage_frame(self, data: dict[str, Any]) -> bytes:
        """The usage chunk the worker did not send (b"" when it did send usage):
        the worker's chunk shape, ``choices: []``, the estimated usage."""
        if self.validator.chunks.usage is not None:
            return b""
        usage = usage_of(None, None, self.prompt_bytes, self._output_estimate())
        frame = {k: ([] if k == "choices" else v) for k, v in data.items() if k != "usage"}
        frame["usage"] = public_usage(usage, full=self.full_usage)
        return b"data: " + orjson.dumps(frame) + b"\n\n"

    def _output_estimate(self) -> int:
        grammar = self.validator.chunks
        if self.kind == "completion":
            return count_output_tokens(self.content_chunks, self.max_tokens)
        return estimate_output_tokens(self.content_chunks, grammar.text.bytes, self.max_tokens)

    def error_frame(self, exc: GatewayError) -> bytes:
        return b"data: " + orjson.dumps(exc.body()) + b"\n\n"

    def report(self) -> Report:
        grammar = self.validator.chunks
        usage = grammar.usage
        counts = None
        if usage is not None:
            counts = (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"])
        return Report(
            finish_reason=grammar.finish_reason,
            usage=usage,
            counts=counts,
            output_estimate=self._output_estimate(),
            outcome="length" if grammar.finish_reason == "length" else "complete",
            nul_replaced=grammar.text.nul_replaced,
            upstream_id=grammar.chunk_id,
        )

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The OpenAI JSON object for a non-streaming caller (spec §9, §14), keys
        in the worker's order (``stop_sequence`` after ``finish_reason``)."""
        answer = self.collected.answer(self.validator.chunks, usage)
        answer["id"] = self.id
        return answer
