"""The Responses named-event dialect (spec §14; the worker's ``responses.rs``). Pure.

Grammar (:class:`ResponsesGrammar`, over events framed by ``gateway/core/sse.py``;
keep-alives may appear anywhere before ``[DONE]``)::

    event: response.created -> output events* -> exactly one terminal
      (response.completed | response.incomplete | response.failed)
      -> data: [DONE] -> EOF

Every event's JSON is an object whose ``type`` is the event's name and whose
``sequence_number`` counts up by one from the first event's (the worker
starts at 0). ``response.created`` comes first and carries the response id
and model; every later ``response`` object must carry the same (a changed id
is a crossed or broken stream). Output events are the ones OpenAI's
Responses API defines for messages, reasoning and function calls
(:data:`OUTPUT_EVENTS`); any other name -- built-in tool events, agentic
progress -- is a violation, and so is an unnamed event other than
``[DONE]``. The worker's ``event: error`` is ``upstream_error`` (raised at
once, although the worker follows it with ``[DONE]``). A terminal event's
usage (``input_tokens + output_tokens == total_tokens``, ``output_tokens``
within ``max_output_tokens``) is checked; ``response.completed`` must carry
it. ``response.failed`` is valid protocol (passed on, then ``[DONE]``; the
receipt says ``upstream_error``). EOF before ``[DONE]`` is
``upstream_unavailable``. Deltas follow ``text_nul`` like chat text.

:class:`ResponsesDialect` re-emits each event with ``model`` set back to the
alias, and answers a non-streaming caller with the terminal event's response
object, its message text as the worker's non-streaming path leaves it
(``chunk_answer.worker_text``).

What the caller gets is filled to validate against the OpenAI SDK's types
(``response_fill.py``), and its ids are the gateway's (spec §21, §24;
``apis/ids.py``): the response's, and every output item's ``id`` (``msg_``,
``fc_``, ``rs_`` by the item's type) and ``call_id`` (``call_``), the same
replacement wherever the worker's id appears in the answer (the item events,
the content events' ``item_id`` and ``call_id``, every response object's
``output``, the copy kept for ``GET`` and follow-ups).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from gateway.apis.base import OneCall, OutputText, Plan, Report, StreamBounds, TextNul
from gateway.apis.chat.answer import worker_text
from gateway.apis.chat.grammar import DONE_FRAME
from gateway.apis.chat.plain import Lazy, plain_text, spliced_text
from gateway.apis.ids import InnerIds, gateway_id
from gateway.apis.responses.fill import (
    LOGPROB_EVENTS,
    fill_item,
    fill_part,
    fill_response,
    fill_usage,
    request_echo,
)
from gateway.apis.usage import estimate_output_tokens, usage_count
from gateway.core.errors import GatewayError
from gateway.core.sse import Framing, StreamValidator, violation

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
OUTPUT_EVENTS = frozenset(
    {
        "response.in_progress",
        "response.queued",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_text.annotation.added",
        "response.refusal.delta",
        "response.refusal.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
    }
)
#: events whose ``delta`` is output text (content, refusal, reasoning)
TEXT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
    }
)
_CREATED = "response.created"
#: every event name a stream may carry
_KNOWN = OUTPUT_EVENTS | TERMINAL_EVENTS | {_CREATED}
#: events whose ``delta`` is counted against the text bound (arguments too)
_DELTAS = TEXT_DELTAS | {"response.function_call_arguments.delta"}
#: the start of each event's frame to the caller, encoded once
_FRAME_HEADS = {name: b"event: " + name.encode() + b"\ndata: " for name in _KNOWN}
#: events that carry one output item whole (``item``)
_ITEM_EVENTS = frozenset({"response.output_item.added", "response.output_item.done"})
#: events about one output item's content: OpenAI names the item (``item_id``)
_ITEM_ID_EVENTS = OUTPUT_EVENTS - _ITEM_EVENTS - {"response.in_progress", "response.queued"}
#: an output item's id prefix by its type, as OpenAI spells them
_ITEM_PREFIXES = {"message": "msg_", "function_call": "fc_", "reasoning": "rs_"}


#: the text delta a stream is mostly made of (a template is learned for it)
_TEXT_DELTA = "response.output_text.delta"
#: text deltas a stream may parse in full to learn its template from
_LEARN_TRIES = 4
#: sentinels a delta's JSON is cut at: each is its own JSON, found once
_SEQ_MARK = 7_305_964_281_130_007
_TEXT_MARK = "\ue000\ue001\ue002"


class ResponseEvent(Lazy):
    """One validated event; ``data`` is the caller's to mutate afterwards.

    A plain delta (a text delta validated on its bytes, see
    :meth:`ResponsesGrammar.on_event`) is parsed only when ``data`` is read
    (:class:`~gateway.apis.chat.plain.Lazy`); ``seq`` is its sequence number.
    ``learned``: the grammar learned its delta template from this event (a
    dialect learns its frame from it)."""

    __slots__ = ("learned", "name", "seq", "text")

    def __init__(
        self,
        name: str,
        data: dict[str, Any] | None,
        text: str,
        *,
        raw: str = "",
        seq: int = -1,
        learned: bool = False,
        loads: Callable[[bytes | str], Any] | None = None,
    ) -> None:
        super().__init__(data, raw, loads)
        self.name = name
        self.text = text
        self.seq = seq
        self.learned = learned

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResponseEvent):
            return NotImplemented
        return (self.name, self.data, self.text) == (other.name, other.data, other.text)

    def __repr__(self) -> str:
        return f"ResponseEvent({self.name!r}, {self._shown()}, {self.text!r})"


def delta_parts(obj: dict[str, Any]) -> tuple[str, str, str] | None:
    """(head, mid, tail): orjson's JSON of the delta event ``obj`` cut at its
    ``sequence_number`` and its ``delta``, so that ``head + str(n) + mid + t +
    tail`` is that JSON with number ``n`` and text ``t`` for any
    :func:`~gateway.apis.chat.plain.plain_text` ``t``; None when the number
    does not come first or orjson cannot write ``obj``."""
    probe = dict(obj)
    probe["sequence_number"] = _SEQ_MARK
    probe["delta"] = _TEXT_MARK
    try:
        dumped = orjson.dumps(probe).decode()
    except TypeError:  # orjson.JSONEncodeError: e.g. an integer past 64 bits
        return None
    number = str(_SEQ_MARK)
    at_n, at_t = dumped.find(number), dumped.find(_TEXT_MARK)
    if at_n < 0 or at_t < at_n or dumped.count(number) != 1 or dumped.count(_TEXT_MARK) != 1:
        return None
    return dumped[:at_n], dumped[at_n + len(number) : at_t], dumped[at_t + len(_TEXT_MARK) :]


def _content_parts(
    response: dict[str, Any], *, messages_only: bool = False
) -> Iterator[dict[str, Any]]:
    """The content parts (objects) of the response's output entries. ``output`` and
    ``content`` are not checked by the grammar: any other shape (not a list, not
    objects) is passed on unread rather than iterated."""
    output = response.get("output")
    if not isinstance(output, list):
        return
    for entry in output:
        if not isinstance(entry, dict) or (messages_only and entry.get("type") != "message"):
            continue
        content = entry.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict):
                    yield part


class ResponsesGrammar:
    """The named-event rules; see the module docstring."""

    def __init__(
        self,
        *,
        max_output_tokens: int | None,
        max_prompt_tokens: int | None = None,
        max_text_bytes: int = 16_777_216,
        text_nul: TextNul = "replace",
        loads: Callable[[bytes | str], Any] = json.loads,
    ) -> None:
        self._max_output_tokens = max_output_tokens
        self._max_prompt_tokens = max_prompt_tokens
        self._text_nul = text_nul
        self._loads = loads
        self._next_seq: int | None = None
        self._done = False
        self.terminal: str | None = None
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self.incomplete_reason: str | None = None
        self.text = OutputText(max_text_bytes, text_nul, "event")
        self.deltas = 0
        #: the stream's text delta cut around its number and text, once learned
        self._delta_cut: tuple[str, str, str] | None = None
        self._learn_left = _LEARN_TRIES

    @property
    def terminated(self) -> bool:
        return self._done

    def on_event(self, name: str | None, data: str) -> ResponseEvent | None:
        if name is None:
            if data == "[DONE]" and self.terminal is not None:
                self._done = True
                return None
            if data == "[DONE]":
                raise violation("Upstream sent [DONE] before a terminal response event.")
            raise violation("Upstream sent an unnamed event in a Responses stream.")
        if self.terminal is not None:
            raise violation("Upstream sent an event after the terminal response event.")
        if name == _TEXT_DELTA and self._delta_cut is not None:
            plain = self._plain_delta(data, self._delta_cut)
            if plain is not None:
                return plain
        if name == "error":
            raise GatewayError("upstream_error")
        if name not in _KNOWN:
            raise violation("Upstream sent an unknown Responses event.")
        obj = self._parse(data)
        if obj.get("type") != name:
            raise violation("Upstream event type does not match its name.")
        seq = self._check_sequence(obj)
        self._check_response(name, obj)
        text = ""
        if name in _DELTAS:
            text = self._delta(obj)
            if name in TEXT_DELTAS:
                self.deltas += 1
        if name in TERMINAL_EVENTS:
            self._on_terminal(name, obj)
        # Counted only once accepted: a gateway error event takes the next number
        # after the last event the caller saw.
        self._next_seq = seq + 1
        learned = (
            name == _TEXT_DELTA and self._delta_cut is None and self._learn(obj, data, seq, text)
        )
        return ResponseEvent(name, obj, text, learned=learned)

    def _plain_delta(self, data: str, parts: tuple[str, str, str]) -> ResponseEvent | None:
        """The text delta when ``data`` is the learned one with the next number
        and a :func:`plain_text` text: then it parses to the learned event with
        those two values, which every check above passes (its name and type,
        the number in order, no response object, a string delta without NUL),
        so only its text is counted. None: check it in full."""
        seq = self.next_sequence_number
        text = spliced_text(data, parts[0] + str(seq) + parts[1], parts[2])
        if text is None:
            return None
        self.text.count(text)
        self.deltas += 1
        self._next_seq = seq + 1
        return ResponseEvent(_TEXT_DELTA, None, text, raw=data, seq=seq, loads=self._loads)

    def _learn(self, obj: dict[str, Any], data: str, seq: int, text: str) -> bool:
        """Learn the text delta from ``obj``, a delta the full checks passed,
        when the worker wrote it (``data``) exactly as orjson writes it."""
        if not text or not plain_text(text) or self._learn_left <= 0:
            return False
        # a worker whose bytes are not orjson's is not asked again and again
        self._learn_left -= 1
        parts = delta_parts(obj)
        if parts is None or data != parts[0] + str(seq) + parts[1] + text + parts[2]:
            return False
        self._delta_cut = parts
        return True

    def _parse(self, data: str) -> dict[str, Any]:
        # A failure is raised outside the handler: the decoder's error holds
        # the document (model output) and must not ride along as the context
        # (``from None`` would do in Python, but not in the compiled build).
        failure: GatewayError | None = None
        try:
            obj = self._loads(data)
        except RecursionError:
            failure = violation("Upstream event is nested too deeply.")
        except ValueError:
            failure = violation("Upstream event is not valid JSON.")
        if failure is not None:
            raise failure
        if not isinstance(obj, dict):
            raise violation("Upstream event is not a JSON object.")
        return obj

    def _check_sequence(self, obj: dict[str, Any]) -> int:
        seq = obj.get("sequence_number")
        if type(seq) is not int or seq < 0:
            raise violation("Upstream event lacks a valid sequence_number.")
        if self._next_seq is not None and seq != self._next_seq:
            raise violation("Upstream event sequence_number is out of order.")
        return seq

    @property
    def next_sequence_number(self) -> int:
        return 0 if self._next_seq is None else self._next_seq

    def _check_response(self, name: str, obj: dict[str, Any]) -> None:
        response = obj.get("response")
        if self.response_id is None:
            if name != _CREATED:
                raise violation("Upstream Responses stream did not start with response.created.")
            if not isinstance(response, dict):
                raise violation("Upstream response.created carries no response object.")
            rid, model = response.get("id"), response.get("model")
            if not isinstance(rid, str) or not rid or not isinstance(model, str):
                raise violation("Upstream response lacks a valid id or model.")
            self.response_id, self.model = rid, model
            return
        if name == _CREATED:
            raise violation("Upstream sent response.created twice.")
        if response is None:
            return
        if not isinstance(response, dict):
            raise violation("Upstream event response is not an object.")
        if response.get("id") != self.response_id:
            raise violation("Upstream response id changed within the stream.")
        if response.get("model") != self.model:
            raise violation("Upstream response model changed within the stream.")

    def _delta(self, obj: dict[str, Any]) -> str:
        value = obj.get("delta")
        if not isinstance(value, str):
            raise violation("Upstream event delta is not a string.")
        if "\x00" in value:
            value = obj["delta"] = self.text.scrub(value)
        self.text.count(value)
        return value

    def _on_terminal(self, name: str, obj: dict[str, Any]) -> None:
        response = obj.get("response")
        if not isinstance(response, dict):
            raise violation("Upstream terminal event carries no response object.")
        usage = response.get("usage")
        if usage is not None:
            if not isinstance(usage, dict):
                raise violation("Upstream response usage is not an object.")
            self.usage = self._check_usage(usage)
        elif name == "response.completed":
            raise violation("Upstream response.completed carries no usage.")
        details = response.get("incomplete_details")
        if isinstance(details, dict) and isinstance(details.get("reason"), str):
            self.incomplete_reason = details["reason"]
        if self._text_nul != "pass":
            self._scrub_output(response)
        self.terminal = name

    def _scrub_output(self, response: dict[str, Any]) -> None:
        """The terminal response repeats the output text: the same NUL rule applies
        (counted once, in the deltas)."""
        counted = self.text.nul_replaced
        if isinstance(response.get("output_text"), str) and "\x00" in response["output_text"]:
            response["output_text"] = self.text.scrub(response["output_text"])
        for part in _content_parts(response):
            text = part.get("text")
            if isinstance(text, str) and "\x00" in text:
                part["text"] = self.text.scrub(text)
        self.text.nul_replaced = counted

    def _check_usage(self, usage: dict[str, Any]) -> dict[str, Any]:
        prompt = usage_count(usage, "input_tokens")
        output = usage_count(usage, "output_tokens")
        if prompt + output != usage_count(usage, "total_tokens"):
            raise violation("Upstream usage does not add up.")
        if self._max_output_tokens is not None and output > self._max_output_tokens:
            raise violation("Upstream usage exceeds the request's max_output_tokens.")
        if self._max_prompt_tokens is not None and prompt > self._max_prompt_tokens:
            raise violation("Upstream usage claims more prompt tokens than were sent.")
        return dict(usage)


class ResponsesValidator(StreamValidator[ResponseEvent]):
    def __init__(self, framing: Framing, grammar: ResponsesGrammar) -> None:
        super().__init__(framing, grammar)
        self._responses = grammar

    @property
    def grammar(self) -> ResponsesGrammar:
        return self._responses


_OUTCOMES = {"response.completed": "complete", "response.failed": "upstream_error"}


def _frame_parts(data: dict[str, Any], frame: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The caller's text delta frame cut around its number and text, when the
    cut reproduces ``frame`` (the event's own frame) byte for byte."""
    parts = delta_parts(data)
    seq, text = data.get("sequence_number"), data.get("delta")
    if parts is None or type(seq) is not int or not isinstance(text, str):
        return None
    head = _FRAME_HEADS[_TEXT_DELTA] + parts[0].encode()
    mid, tail = parts[1].encode(), parts[2].encode() + b"\n\n"
    if head + str(seq).encode() + mid + text.encode() + tail != frame:
        return None
    return head, mid, tail


class ResponsesDialect(OneCall):
    """One Responses answer, for a streaming or a non-streaming caller."""

    usage_source = "reported"

    def __init__(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> None:
        self.terminal_frame = DONE_FRAME
        grammar = ResponsesGrammar(
            max_output_tokens=plan.max_tokens,
            max_prompt_tokens=bounds.max_prompt_tokens,
            max_text_bytes=bounds.max_text_bytes,
            text_nul=bounds.text_nul,
            loads=orjson.loads,
        )
        self.validator = ResponsesValidator(bounds.framing, grammar)
        self.alias = plan.alias
        # The gateway's own id (spec §21); the worker's goes to the receipt.
        self.id = gateway_id("resp_")
        #: the worker's ids inside the answer -> the gateway's
        self.inner = InnerIds()
        self.full_usage = plan.full_usage
        self.echo = request_echo(plan)
        self.collect = collect
        self.has_content = False
        self._response: dict[str, Any] | None = None
        #: output_index -> the id of the item announced there (``item_id``)
        self._item_ids: dict[int, str] = {}
        #: the caller's text delta frame cut around its number and text, once
        #: learned from the frame of the event the grammar learned its from
        self._delta_frame: tuple[bytes, bytes, bytes] | None = None

    @property
    def source(self) -> ResponsesValidator:
        return self.validator

    def on_item(self, event: ResponseEvent) -> bytes | None:
        name = event.name
        if event.text or name in TERMINAL_EVENTS:
            self.has_content = True
        if event.plain:
            if self.collect:
                return None  # a text delta carries no response object
            frame = self._delta_frame
            if frame is not None:
                # The learned event with another number and text: its frame is
                # the learned frame with them (the item id and the rest unchanged).
                number = str(event.seq).encode()
                return frame[0] + number + frame[1] + event.text.encode() + frame[2]
        data = event.data
        response = data.get("response")
        if isinstance(response, dict):
            response["id"] = self.id
            response["model"] = self.alias
            response.update(self.echo)
            fill_response(response, full_usage=self.full_usage)
            output = response.get("output")
            if isinstance(output, list):
                for item in output:
                    self._own_item(item)
            if name in TERMINAL_EVENTS:
                self._response = response
        if self.collect:
            return None
        if name in _ITEM_ID_EVENTS:
            self._fill_content_event(name, data)
        elif name in _ITEM_EVENTS:
            self._fill_item_event(data)
        out = _FRAME_HEADS[name] + orjson.dumps(data) + b"\n\n"
        if event.learned and self._delta_frame is None:
            self._delta_frame = _frame_parts(data, out)
        return out

    def _own_item(self, item: Any) -> None:
        """An output item's ids, the gateway's (the same each time it appears)."""
        if isinstance(item, dict):
            kind = item.get("type")
            self.inner.swap_key(item, "id", _ITEM_PREFIXES.get(kind) if type(kind) is str else None)
            self.inner.swap_key(item, "call_id", "call_")

    def _fill_content_event(self, name: str, data: dict[str, Any]) -> None:
        if "call_id" in data:
            data["call_id"] = self.inner.swap(data["call_id"], "call_")
        if "item_id" in data:
            data["item_id"] = self.inner.swap(data["item_id"])
        else:
            index = data.get("output_index")
            # type(): a bool is no index, and an unhashable value must not reach get()
            item_id = self._item_ids.get(index) if type(index) is int else None
            if item_id is not None:
                data["item_id"] = item_id
        if name in LOGPROB_EVENTS and "logprobs" not in data:
            data["logprobs"] = []
        if "part" in data:
            fill_part(data["part"])

    def _fill_item_event(self, data: dict[str, Any]) -> None:
        item = data.get("item")
        self._own_item(item)
        index = data.get("output_index")
        if isinstance(item, dict) and type(index) is int and isinstance(item.get("id"), str):
            self._item_ids[index] = item["id"]
        fill_item(item)

    def error_frame(self, exc: GatewayError) -> bytes:
        body = {
            "type": "error",
            "code": exc.code,
            "message": exc.message,
            "param": None,
            "sequence_number": self.validator.grammar.next_sequence_number,
        }
        return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"

    def report(self) -> Report:
        grammar = self.validator.grammar
        usage = grammar.usage
        counts = None
        if usage is not None:
            counts = (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"])
        terminal = grammar.terminal
        outcome = _OUTCOMES.get(terminal or "", "complete")
        finish = "stop" if terminal == "response.completed" else None
        if terminal == "response.incomplete":
            length = grammar.incomplete_reason == "max_output_tokens"
            outcome = "length" if length else "incomplete"
            finish = "length" if length else grammar.incomplete_reason
        return Report(
            finish_reason=finish,
            usage=usage,
            counts=counts,
            output_estimate=estimate_output_tokens(grammar.deltas, grammar.text.bytes),
            outcome=outcome,
            nul_replaced=grammar.text.nul_replaced,
            response_id=self.id if grammar.response_id is not None else None,
            upstream_id=grammar.response_id,
            final=self._response,
        )

    def answer(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The terminal event's response object, as the worker answers non-streamed:
        message text with its leading whitespace trimmed (``chunk_answer.worker_text``)."""
        response = self._response
        assert response is not None, "answer() before a terminal event"
        for part in _content_parts(response, messages_only=True):
            if isinstance(part.get("text"), str):
                part["text"] = worker_text(part["text"], None, ())
        if isinstance(response.get("output_text"), str):
            response["output_text"] = worker_text(response["output_text"], None, ())
        if response.get("usage") is None:
            # Estimated by the gateway (the worker sent none): marked in x-usage-source.
            response["usage"] = {
                "input_tokens": usage["prompt_tokens"],
                "output_tokens": usage["completion_tokens"],
                "total_tokens": usage["total_tokens"],
            }
            fill_usage(response["usage"])
        return response
