"""An adapter around the mistral.rs engine (test equipment), on loopback HTTP/1.1.

This is NOT ``mistralrs serve``: it wraps one ``mistralrs.Runner`` (the real
engine, through its Python SDK) and frames the engine's own response objects
the way the reference says the server does (``shared/reference/mistralrs-http.md``
§2 to §5, §7). The model it serves has random weights: its text means nothing.

Routes: ``GET /v1/models``; ``POST /v1/chat/completions`` (JSON, or SSE with
``stream: true``); ``POST /v1/completions`` (JSON only: the SDK has no
streaming completion call, so a stream request is 501); ``POST
/v1/images/generations`` and ``POST /v1/audio/speech`` (an image or a speech
model's, ``media.py``: the engine refuses them on a chat model, and a chat
request on theirs); ``POST /v1/agent/approvals/{id}`` (the server's approval
route, ``agents.py``);
``GET /health``; ``GET /adapter/stats`` (counters for tests, :class:`Stats`);
``GET /adapter/agent-runs`` (every agentic request as the adapter saw it) and
``GET /adapter/sessions/{id}`` (the engine's own export of an agentic session).

Agentic requests (``web_search_options`` or ``max_tool_rounds``) run the
engine's real agentic loop; the worker's named events around its chunks are
the adapter's framing of what the engine's callbacks showed (``agents.py``
says what is the engine's and what is framed).

Streams: headers are committed first (status 200), then one ``data: <json>``
event per engine chunk, a bare ``:`` comment after ``keepalive_ms`` without
one, and ``data: [DONE]`` after the chunk whose every choice has a
``finish_reason`` (the SDK's streamer ends there) or after an in-band error
event ``{"error": {...}}``. When the engine closes a stream without a final
chunk (an agentic run that ends in a tool call: the round cap reached; the
SDK raises "Received none in ChatCompletionStreamer"), the body just ends, no
``[DONE]``, as the server's stream ends when the engine's channel closes.
When the caller goes away mid-stream, the engine's streamer is dropped at
once (``engine.py``) and the stream counts as dropped.

Errors: 415/400/422 text for bodies that are not JSON objects of the right
shape (as axum answers); an unknown ``model`` is 500 ``{"message"}`` as the
server's request parsing answers; every engine refusal of a non-streaming
request is 422 ``{"message"}`` (the SDK gives one exception type for the
engine's validation, internal and model errors, so the server's 500 cases
cannot be told apart here).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys
import tempfile
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from gateway.testing.engine import media, serde, translate
from gateway.testing.engine.agents import AgentRun, Sink, runs_json
from gateway.testing.engine.engine import ChunkStream, Engine, EngineError
from gateway.testing.engine.http import LAST_CHUNK, Connection, Request, chunk, head

_KEEPALIVE = b":\n\n"
_DONE = b"data: [DONE]\n\n"
_JSON = ("content-type", "application/json")
_TEXT = ("content-type", "text/plain; charset=utf-8")
#: the SDK's error when the engine's channel closed before a final chunk
CLOSED_EARLY = "Received none in ChatCompletionStreamer"
_APPROVALS = "/v1/agent/approvals/"
_SESSIONS = "/adapter/sessions/"
_ASK_NEEDS_STREAM = (
    'agent_permission "ask" requires stream=true over HTTP; approve or deny emitted '
    "requests with POST /v1/agent/approvals/{approval_id}."
)


@dataclass
class Stats:
    """What tests observe (``GET /adapter/stats``)."""

    streams_started: int = 0
    streams_finished: int = 0  # ended with the finish chunk and [DONE]
    streams_failed: int = 0  # ended with an in-band error event and [DONE]
    streams_dropped: int = 0  # the caller went away first
    streams_unfinished: int = 0  # the engine closed it without a final chunk: no [DONE]
    active_streams: int = 0
    chunks_streamed: int = 0  # data events written, [DONE] and errors excluded
    tokens_streamed: int = 0  # completion_tokens of the finished streams' usage
    requests: int = 0
    images_generated: int = 0  # the engine's generate_image calls answered
    speech_generated: int = 0  # the engine's generate_audio calls answered


class Adapter:
    """The server: ``await start()``, then ``port``; ``await close()``."""

    def __init__(
        self,
        engine: Engine,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keepalive_ms: float = 10_000,
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the adapter binds loopback only")
        self.engine = engine
        self.stats = Stats()
        self._host = host
        self._port = port
        self._keepalive_s = keepalive_ms / 1000
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # ``Url`` images: the server writes them into its working directory; the
        # adapter into a folder of its own, removed when it closes.
        self._images = tempfile.TemporaryDirectory(prefix="engine-adapter-images-")

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("not started")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._images.cleanup()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        conn = Connection(reader, writer)
        try:
            while (request := await conn.next_request()) is not None:
                keep = await self._dispatch(conn, request)
                if not keep:
                    break
        except ConnectionError:
            pass
        except asyncio.CancelledError:
            pass  # the adapter is closing: this task ends quietly (asyncio logs a cancelled one)
        except Exception:  # a bug here: say so, and drop the connection
            traceback.print_exc(file=sys.stderr)
        finally:
            await conn.close()
            if task is not None:
                self._connections.discard(task)

    async def _dispatch(self, conn: Connection, request: Request) -> bool:
        """Answer one request; whether the connection may carry another."""
        self.stats.requests += 1
        if request.refusal is not None:
            status, text = request.refusal
            await conn.respond(status, [_TEXT], text.encode(), keep_alive=False)
            return False
        rid = request_id(request.headers.get("x-request-id"))
        keep = request.keep_alive
        base = [("x-request-id", rid)]
        routes = {
            "/v1/models": ("GET", self._models),
            "/v1/chat/completions": ("POST", self._chat),
            "/v1/completions": ("POST", self._completions),
            "/v1/images/generations": ("POST", self._image),
            "/v1/audio/speech": ("POST", self._speech),
            "/adapter/stats": ("GET", self._stats),
            "/adapter/agent-runs": ("GET", self._agent_runs),
            "/metrics": ("GET", self._metrics),
            "/health": ("GET", self._health),
        }
        route = routes.get(request.path)
        if route is None and request.path.startswith(_APPROVALS):
            route = ("POST", self._approval)
        elif route is None and request.path.startswith(_SESSIONS):
            route = ("GET", self._session)
        if route is None:
            await conn.respond(404, base, b"", keep_alive=keep)
            return keep
        method, handler = route
        if request.method != method:
            await conn.respond(405, [*base, ("allow", method)], b"", keep_alive=keep)
            return keep
        await handler(conn, request, base)
        return keep

    # -- routes

    async def _health(self, conn: Connection, request: Request, base: list[Any]) -> None:
        await conn.respond(200, [*base, _TEXT], b"OK", keep_alive=request.keep_alive)

    async def _metrics(self, conn: Connection, request: Request, base: list[Any]) -> None:
        """The engine's sequence families as far as the SDK lets the adapter see
        them (docs/engine-lane.md): a sequence runs while its streamer is open
        (the engine ends it at its next send after the streamer is dropped), none
        waits where the adapter can see it, and a stream whose caller left counts
        as canceled once its streamer is gone."""
        engine, stats = self.engine, self.stats
        running = engine.open_streamers
        canceled = stats.streams_dropped - max(0, running - stats.active_streams)
        text = (
            "# mistral.rs engine adapter (test equipment): the SDK's view\n"
            "# TYPE mistralrs_sequences_running gauge\n"
            f"mistralrs_sequences_running {running}\n"
            "# TYPE mistralrs_sequences_waiting gauge\n"
            "mistralrs_sequences_waiting 0\n"
            "# TYPE mistralrs_sequences_completed_total counter\n"
            f'mistralrs_sequences_completed_total{{reason="canceled"}} {max(0, canceled)}\n'
        )
        headers = [*base, ("content-type", "text/plain; version=0.0.4")]
        await conn.respond(200, headers, text.encode(), keep_alive=request.keep_alive)

    async def _stats(self, conn: Connection, request: Request, base: list[Any]) -> None:
        body = {
            **dataclasses.asdict(self.stats),
            "open_streamers": self.engine.open_streamers,
            "pid": os.getpid(),
            "model": self.engine.model_id,
            "load_seconds": self.engine.load_seconds,
        }
        await conn.respond(
            200, [*base, _JSON], json.dumps(body).encode(), keep_alive=request.keep_alive
        )

    async def _agent_runs(self, conn: Connection, request: Request, base: list[Any]) -> None:
        desk = self.engine.desk
        body = {"runs": runs_json(desk), "unattributed_searches": desk.unattributed_searches}
        await conn.respond(
            200, [*base, _JSON], json.dumps(body).encode(), keep_alive=request.keep_alive
        )

    async def _session(self, conn: Connection, request: Request, base: list[Any]) -> None:
        """The engine's own export of an agentic session (``Runner.export_session``)."""
        exported = await self.engine.export_session(request.path[len(_SESSIONS) :])
        if exported is None:
            await conn.respond(404, base, b"", keep_alive=request.keep_alive)
            return
        await conn.respond(200, [*base, _JSON], exported.encode(), keep_alive=request.keep_alive)

    async def _approval(self, conn: Connection, request: Request, base: list[Any]) -> None:
        """``POST /v1/agent/approvals/{id}`` as the server's route answers it:
        ``{"decision": "approve"|"deny", "remember_for_session"?, "message"?}``;
        200 ``{"status":"resolved"}`` or 404 ``{"status":"not_found"}``."""
        body = await self._body(conn, request, base)
        if body is None:
            return
        decision = body.get("decision")
        message = body.get("message")
        if "decision" not in body:
            await self._deserialize_error(conn, request, base, "missing field `decision`")
            return
        if decision not in ("approve", "deny"):
            text = f"decision: unknown variant `{decision}`, expected `approve` or `deny`"
            await self._deserialize_error(conn, request, base, text)
            return
        remember = body.get("remember_for_session", False)
        if not isinstance(remember, bool) or not (message is None or isinstance(message, str)):
            await self._deserialize_error(conn, request, base, "invalid type")
            return
        status = self.engine.desk.resolve(
            request.path[len(_APPROVALS) :], decision == "approve", message
        )
        code = 200 if status == "resolved" else 404
        payload = serde.dumps({"status": status})
        await conn.respond(code, [*base, _JSON], payload, keep_alive=request.keep_alive)

    async def _image(self, conn: Connection, request: Request, base: list[Any]) -> None:
        """``POST /v1/images/generations``: the engine's ``ImageGenerationResponse``
        (``B64Json``: a ``data:image/png;base64,`` URL; ``Url``: the PNG's file
        name, the file in the adapter's own folder)."""
        body = await self._body(conn, request, base)
        if body is None:
            return
        try:
            asked = media.image_request(body)
        except media.MediaBodyError as exc:
            await self._deserialize_error(conn, request, base, exc)
            return
        if not await self._model_known(conn, request, base, body):
            return
        name = f"image-generation-{uuid.uuid4()}.png"
        save = os.path.join(self._images.name, name) if asked.response_format == "Url" else None
        try:
            answer = await self.engine.image(
                asked.prompt, asked.response_format, asked.height, asked.width, save
            )
        except EngineError as exc:
            await self._message(conn, request, base, 422, str(exc))
            return
        self.stats.images_generated += 1
        wire = serde.to_wire(answer)
        if save is not None:
            for choice in wire["data"]:
                if choice.get("url") == save:
                    choice["url"] = name  # the server's answer: the file's relative name
        payload = serde.dumps(wire)
        await conn.respond(200, [*base, _JSON], payload, keep_alive=request.keep_alive)

    async def _speech(self, conn: Connection, request: Request, base: list[Any]) -> None:
        """``POST /v1/audio/speech``: the engine's PCM as WAV or raw s16le bytes."""
        body = await self._body(conn, request, base)
        if body is None:
            return
        try:
            asked = media.speech_request(body)
        except media.MediaBodyError as exc:
            await self._deserialize_error(conn, request, base, exc)
            return
        if not await self._model_known(conn, request, base, body):
            return
        if asked.response_format not in media.SERVED_AUDIO:
            await self._message(conn, request, base, 422, media.ONLY_WAV_PCM)
            return
        try:
            answer = await self.engine.speech(asked.input)
        except EngineError as exc:
            await self._message(conn, request, base, 422, str(exc))
            return
        self.stats.speech_generated += 1
        rate, channels = int(answer.rate), int(answer.channels)
        if asked.response_format == "wav":
            payload = media.wav(answer.pcm, rate, channels)
        else:
            payload = media.pcm16(answer.pcm)
        kind = ("content-type", media.audio_content_type(asked.response_format, rate, channels))
        await conn.respond(200, [*base, kind], payload, keep_alive=request.keep_alive)

    async def _models(self, conn: Connection, request: Request, base: list[Any]) -> None:
        created = self.engine.created
        data: list[dict[str, Any]] = [
            {"id": "default", "object": "model", "created": created, "owned_by": "local",
             "root": "default"}
        ]  # fmt: skip
        for model_id, status in self.engine.statuses():
            data.append(
                {"id": model_id, "object": "model", "created": created, "owned_by": "local",
                 "root": model_id, "status": status}
            )  # fmt: skip
        body = serde.dumps({"object": "list", "data": data})
        await conn.respond(200, [*base, _JSON], body, keep_alive=request.keep_alive)

    async def _chat(self, conn: Connection, request: Request, base: list[Any]) -> None:
        body = await self._body(conn, request, base)
        if body is None:
            return
        try:
            stream = translate.wants_stream(body)
            agentic = translate.agentic(body)
            permission = translate.permission(body)
            translate.chat_request(body)  # the body's shape, before anything runs
        except translate.BodyError as exc:
            await self._deserialize_error(conn, request, base, exc)
            return
        if not await self._model_known(conn, request, base, body):
            return
        if agentic and self.engine.agentic_runner:
            if permission == "ask" and not stream:
                await self._message(conn, request, base, 422, _ASK_NEEDS_STREAM)
                return
            sink = Sink(asyncio.get_running_loop()) if stream else None
            run = self.engine.desk.start(body, permission, sink)
            sdk_request = translate.chat_request(body, run.callback())
            if stream:
                await self._stream(conn, request, base, sdk_request, run, sink)
                return
            try:
                answer = await self.engine.agent_chat(sdk_request)
            except EngineError as exc:
                run.finish("failed", str(exc))
                await self._message(conn, request, base, 422, str(exc))
                return
            run.saw_session(answer.session_id)
            run.finish("answered")
            payload = serde.dumps(serde.to_wire(answer))
            await conn.respond(200, [*base, _JSON], payload, keep_alive=request.keep_alive)
            return
        sdk_request = translate.chat_request(body)
        if stream:
            await self._stream(conn, request, base, sdk_request)
            return
        try:
            answer = await self.engine.chat(sdk_request)
        except EngineError as exc:
            await self._message(conn, request, base, 422, str(exc))
            return
        payload = serde.dumps(serde.to_wire(answer))
        await conn.respond(200, [*base, _JSON], payload, keep_alive=request.keep_alive)

    async def _completions(self, conn: Connection, request: Request, base: list[Any]) -> None:
        body = await self._body(conn, request, base)
        if body is None:
            return
        try:
            sdk_request = translate.completion_request(body)
            stream = translate.wants_stream(body)
        except translate.BodyError as exc:
            await self._deserialize_error(conn, request, base, exc)
            return
        if not await self._model_known(conn, request, base, body):
            return
        if stream:
            text = "this adapter cannot stream /v1/completions: the mistralrs SDK has no such call"
            await self._message(conn, request, base, 501, text)
            return
        try:
            answer = await self.engine.completion(sdk_request)
        except EngineError as exc:
            await self._message(conn, request, base, 422, str(exc))
            return
        payload = serde.dumps(serde.to_wire(answer))
        await conn.respond(200, [*base, _JSON], payload, keep_alive=request.keep_alive)

    # -- streams

    async def _stream(
        self,
        conn: Connection,
        request: Request,
        base: list[Any],
        sdk_request: Any,
        run: AgentRun | None = None,
        sink: Sink | None = None,
    ) -> None:
        stats = self.stats
        stats.streams_started += 1
        stats.active_streams += 1
        outcome = "dropped"
        error: str | None = None
        stream: ChunkStream | None = None
        try:
            headers = [
                ("content-type", "text/event-stream"),
                ("cache-control", "no-cache"),
                *base,
                ("transfer-encoding", "chunked"),
            ]
            await conn.write(head(200, headers, keep_alive=request.keep_alive))
            try:
                if run is None:
                    stream = await self.engine.stream(sdk_request)
                else:
                    stream = await self.engine.agent_stream(sdk_request)
                outcome = await self._relay(conn, stream, run, sink)
            except EngineError as exc:
                error = str(exc)
                frames = self._agent_frames(run, sink)
                if error == CLOSED_EARLY:
                    await conn.write(frames + LAST_CHUNK)
                    outcome = "unfinished"
                else:
                    event = chunk(_error_event(error)) + chunk(_DONE)
                    await conn.write(frames + event + LAST_CHUNK)
                    outcome = "failed"
        except ConnectionError:
            outcome = "dropped"
        finally:
            if stream is not None:
                stream.close()
            if run is not None:
                run.finish(outcome, error)
            stats.active_streams -= 1
            if outcome == "finished":
                stats.streams_finished += 1
            elif outcome == "failed":
                stats.streams_failed += 1
            elif outcome == "unfinished":
                stats.streams_unfinished += 1
            else:
                stats.streams_dropped += 1

    async def _relay(
        self, conn: Connection, stream: ChunkStream, run: AgentRun | None, sink: Sink | None
    ) -> str:
        """Engine chunks (and an agentic run's events) → SSE until the end;
        ``finished`` or ``dropped``."""
        while True:
            if sink is not None and sink.frames:
                await conn.write(b"".join(chunk(frame) for frame in sink.drain()))
            pending = stream.fetch()
            waits: set[asyncio.Future[Any]] = {pending, conn.gone}
            arrived = None
            if sink is not None:
                arrived = asyncio.ensure_future(sink.arrived.wait())
                waits.add(arrived)
            try:
                await asyncio.wait(
                    waits, timeout=self._keepalive_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                if arrived is not None:
                    arrived.cancel()
            if conn.gone.done():
                return "dropped"
            if sink is not None and sink.frames:
                continue  # the events the engine's callbacks wrote come first
            if not pending.done():
                await conn.write(chunk(_KEEPALIVE))
                continue
            item = stream.take()
            frames = self._agent_frames(run, sink)
            if item is None:
                await conn.write(frames + chunk(_DONE) + LAST_CHUNK)
                return "finished"
            if run is not None:
                run.saw_session(getattr(item, "session_id", None))
            data = chunk(b"data: " + serde.dumps(serde.to_wire(item)) + b"\n\n")
            await conn.write(frames + data)
            self.stats.chunks_streamed += 1
            if item.usage is not None:
                self.stats.tokens_streamed += int(item.usage.completion_tokens)

    def _agent_frames(self, run: AgentRun | None, sink: Sink | None) -> bytes:
        """The events still due before the engine's next chunk or its end: those
        queued (every callback the engine ran before making that chunk has been
        appended by now: the loop runs thread-safe calls in order), and the
        completion of a round whose tool callback never ran."""
        if run is None or sink is None:
            return b""
        frames = sink.drain()
        settled = run.settle_open_round()
        if settled is not None:
            frames.append(settled)
        return b"".join(chunk(frame) for frame in frames)

    # -- helpers

    async def _body(
        self, conn: Connection, request: Request, base: list[Any]
    ) -> dict[str, Any] | None:
        content_type = request.headers.get("content-type", "")
        if content_type.split(";")[0].strip().lower() != "application/json":
            text = b"Expected request with `Content-Type: application/json`"
            await conn.respond(415, [*base, _TEXT], text, keep_alive=request.keep_alive)
            return None
        try:
            body = json.loads(request.body)
        except ValueError as exc:
            text = f"Failed to parse the request body as JSON: {exc}".encode()
            await conn.respond(400, [*base, _TEXT], text, keep_alive=request.keep_alive)
            return None
        if not isinstance(body, dict):
            await self._deserialize_error(conn, request, base, "expected a JSON object")
            return None
        return body

    async def _model_known(
        self, conn: Connection, request: Request, base: list[Any], body: dict[str, Any]
    ) -> bool:
        model = translate.requested_model(body)
        if model in ("default", self.engine.model_id):
            return True
        text = (
            f"Requested model '{model}' is not available. Available models: "
            f"{self.engine.model_id}. Use 'default' to use the default model."
        )
        await self._message(conn, request, base, 500, text)
        return False

    async def _deserialize_error(
        self, conn: Connection, request: Request, base: list[Any], exc: object
    ) -> None:
        text = f"Failed to deserialize the JSON body into the target type: {exc}".encode()
        await conn.respond(422, [*base, _TEXT], text, keep_alive=request.keep_alive)

    async def _message(
        self, conn: Connection, request: Request, base: list[Any], status: int, text: str
    ) -> None:
        body = serde.dumps({"message": text})
        await conn.respond(status, [*base, _JSON], body, keep_alive=request.keep_alive)


def request_id(value: str | None) -> str:
    """A caller's non-empty visible-ASCII ``x-request-id`` verbatim, else ``req_`` + 32 hex."""
    if value and all(0x20 <= ord(c) < 0x7F or c == "\t" for c in value):
        return value
    return "req_" + uuid.uuid4().hex


def _error_event(message: str) -> bytes:
    error = {"message": message, "type": "server_error", "param": None, "code": None}
    return b"data: " + serde.dumps({"error": error}) + b"\n\n"
