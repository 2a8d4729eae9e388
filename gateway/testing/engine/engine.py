"""One ``mistralrs.Runner`` and the bounded threads that talk to it (test equipment).

Theory of operation: the SDK is synchronous. No engine call runs on the
event loop (the SDK releases the GIL while it waits for the engine). A stream
is the SDK's ``ChatCompletionStreamer``; :class:`ChunkStream` asks it for one
chunk at a time on a bounded thread pool, so at most one call per stream is in
flight and a slow reader slows the asking, not the loop.

The ``Runner`` is one pyo3 object whose request methods borrow it mutably for
the whole call: a second call on it meanwhile (another request, or even
``list_models_with_status``) fails with ``RuntimeError: Already borrowed``, and
a non-streaming call holds it until its answer is complete. So every call on
the Runner runs on one thread of its own, one after another (a non-streaming
request delays the start of any other request until it is answered; streams
already started go on, their streamers are objects of their own), and the
model's status is read once, at load (this adapter never unloads it).

Cancellation: the engine decodes into a channel of 10,000 responses, so a
streamer that is merely not read keeps decoding. What stops it is dropping the
streamer (its channel receiver goes, the engine's next send fails, the sequence
ends ``canceled``). :meth:`ChunkStream.close` drops the last reference at once,
or, when a call is in flight on a thread, the moment that call returns (the
engine has a token ready within one decode step). ``open_streamers`` counts the
streamers not yet dropped.

The engine may hold an image (FLUX) or a speech (Dia) model instead
(``kind``, ``mediagen.py``): the same single thread serves its
``generate_image`` / ``generate_audio`` calls, and a chat request reaches it
too (the engine refuses it, as the server's would).

Agentic requests (``agents.py``) go to a second Runner over the same model
folder, made on the first such request: it carries the adapter's search
callback and a chat template that accepts the agentic loop's ``tool`` turns
(the model's own refuses them), and its calls run on a thread of their own
too. Plain requests never meet either.

Errors: the SDK raises ``ValueError`` alike for the engine's validation,
internal and model errors; they become :class:`EngineError`.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import mistralrs

from gateway.testing.engine.agents import AGENT_CHAT_TEMPLATE, AgentDesk

T = TypeVar("T")

#: what the engine may serve: a chat model, an image (FLUX) or a speech (Dia) model
KINDS = ("chat", "image", "speech")

_END: Any = object()


class EngineError(Exception):
    """The engine refused or failed a request (its message, as the SDK gives it)."""


class Engine:
    """The model, loaded once; calls on a bounded pool of threads."""

    def __init__(
        self,
        folder: Path,
        *,
        kind: str = "chat",
        dac: Path | None = None,
        max_seqs: int = 8,
        threads: int = 16,
        desk: AgentDesk | None = None,
    ) -> None:
        started = time.monotonic()
        if kind not in KINDS:
            raise ValueError(f"unknown model kind {kind!r}")
        self.kind = kind
        self.model_id = str(folder)
        self._dac = dac
        self._max_seqs = max_seqs
        self._runner = mistralrs.Runner(
            which=self._which(),
            token_source="none",  # noqa: S106 - no hub token: the model is local
            max_seqs=max_seqs,
        )
        self.load_seconds = time.monotonic() - started
        self.created = int(time.time())
        self.open_streamers = 0
        self._statuses = [tuple(s) for s in self._runner.list_models_with_status()]
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="engine")
        # the Runner's own thread: its calls one at a time (see the module docstring)
        self._runner_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="runner")
        self.desk = desk or AgentDesk()
        self._agent_runner: Any = None
        self._agent_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-runner")
        self._template_dir: tempfile.TemporaryDirectory[str] | None = None

    def _which(self) -> Any:
        # The SDK's stub types Which's variants as classes of their own, not as Which.
        if self.kind == "image":
            return mistralrs.Which.DiffusionPlain(
                model_id=self.model_id,
                arch=mistralrs.DiffusionArchitecture.Flux,
                dtype=mistralrs.ModelDType.F16,
            )
        if self.kind == "speech":
            return mistralrs.Which.Speech(
                model_id=self.model_id,
                arch=mistralrs.SpeechLoaderType.Dia,
                dac_model_id=str(self._dac),  # never the engine's default: that is the Hub
                dtype=mistralrs.ModelDType.F32,
            )
        return mistralrs.Which.Plain(
            model_id=self.model_id,
            arch=mistralrs.Architecture.Llama,
            dtype=mistralrs.ModelDType.F16,  # as stored; the fastest on this CPU
        )

    @property
    def agentic_runner(self) -> bool:
        """Whether agentic requests get the agentic Runner (a chat model only)."""
        return self.kind == "chat"

    def statuses(self) -> list[tuple[str, str]]:
        """``(model id, status)`` for every model the runner knows (read at load)."""
        return [(str(model_id), str(status)) for model_id, status in self._statuses]

    async def chat(self, request: mistralrs.ChatCompletionRequest) -> Any:
        """A non-streaming chat answer, from the SDK's own non-streaming call."""
        return await self._call(self._runner.send_chat_completion_request, request)

    async def completion(self, request: mistralrs.CompletionRequest) -> Any:
        """A non-streaming text completion."""
        return await self._call(self._runner.send_completion_request, request)

    async def stream(self, request: mistralrs.ChatCompletionRequest) -> ChunkStream:
        """Start a streaming chat request (``request.stream`` must be true)."""
        streamer = await self._call(self._runner.send_chat_completion_request, request)
        self.open_streamers += 1
        return ChunkStream(self, streamer)

    async def image(
        self, prompt: str, response_format: str, height: int, width: int, save_file: str | None
    ) -> Any:
        """The engine's ``generate_image`` (``B64Json``: a data URL; ``Url``: a PNG file)."""
        fmt = getattr(mistralrs.ImageGenerationResponseFormat, response_format)
        return await self._call(
            lambda: self._runner.generate_image(
                prompt, fmt, height=height, width=width, save_file=save_file
            )
        )

    async def speech(self, prompt: str) -> Any:
        """The engine's ``generate_audio``: PCM floats, the rate, the channels."""
        return await self._call(self._runner.generate_audio, prompt)

    async def agent_chat(self, request: mistralrs.ChatCompletionRequest) -> Any:
        """A non-streaming agentic answer (the agentic Runner)."""
        return await self._agent_call(lambda: self._agentic().send_chat_completion_request(request))

    async def agent_stream(self, request: mistralrs.ChatCompletionRequest) -> ChunkStream:
        """Start a streaming agentic request on the agentic Runner."""
        streamer = await self._agent_call(
            lambda: self._agentic().send_chat_completion_request(request)
        )
        self.open_streamers += 1
        return ChunkStream(self, streamer)

    async def export_session(self, session_id: str) -> str | None:
        """The engine's own record of an agentic session (its JSON), or None."""
        if self._agent_runner is None:
            return None
        exported: str | None = await self._agent_call(
            lambda: self._agentic().export_session(session_id)
        )
        return exported

    async def session_ids(self) -> list[str]:
        if self._agent_runner is None:
            return []
        ids: list[str] = await self._agent_call(lambda: self._agentic().list_session_ids())
        return [str(i) for i in ids]

    def close(self) -> None:
        self.desk.close()
        self._runner_thread.shutdown(wait=False, cancel_futures=True)
        self._agent_thread.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._template_dir is not None:
            self._template_dir.cleanup()

    def _agentic(self) -> Any:
        """The agentic Runner, made on first use (on its own thread)."""
        if self._agent_runner is None:
            self._template_dir = tempfile.TemporaryDirectory(prefix="engine-adapter-")
            template = os.path.join(self._template_dir.name, "agent_chat_template.jinja")
            with open(template, "w", encoding="utf-8") as out:
                out.write(AGENT_CHAT_TEMPLATE)
            self._agent_runner = mistralrs.Runner(
                which=self._which(),
                token_source="none",  # noqa: S106 - no hub token: the model is local
                max_seqs=self._max_seqs,
                jinja_explicit=template,
                search_callback=self.desk.search,
            )
        return self._agent_runner

    async def _agent_call(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._agent_thread, fn)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """One call on the Runner, on its own thread."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._runner_thread, fn, *args)
        except ValueError as exc:
            raise EngineError(str(exc)) from exc

    def _submit_next(self, streamer: Any) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().run_in_executor(self._pool, next, streamer, _END)

    def _released(self) -> None:
        self.open_streamers -= 1


class ChunkStream:
    """One streaming request's chunks, pulled one at a time (see the module docstring).

    ``fetch()`` is the call in flight (started if none is); once it is done,
    ``take()`` gives its chunk, ``None`` at the end, or raises :class:`EngineError`.
    """

    def __init__(self, engine: Engine, streamer: Any) -> None:
        self._engine = engine
        self._streamer: Any = streamer
        self._pending: asyncio.Future[Any] | None = None

    def fetch(self) -> asyncio.Future[Any]:
        if self._pending is None:
            if self._streamer is None:
                raise RuntimeError("the stream is closed")
            self._pending = self._engine._submit_next(self._streamer)
        return self._pending

    def take(self) -> Any:
        pending, self._pending = self.fetch(), None
        try:
            item = pending.result()
        except ValueError as exc:
            self._drop()
            raise EngineError(str(exc)) from exc
        if item is _END:
            self._drop()
            return None
        return item

    def close(self) -> None:
        """Drop the streamer now, or as soon as the call in flight returns."""
        pending, self._pending = self._pending, None
        if pending is None or pending.done():
            self._drop()
        else:
            pending.add_done_callback(self._drop_after)

    def _drop_after(self, pending: asyncio.Future[Any]) -> None:
        if not pending.cancelled():
            pending.exception()  # retrieved: an error after the caller left is nobody's
        self._drop()

    def _drop(self) -> None:
        if self._streamer is not None:
            self._streamer = None  # the last reference: the engine's receiver goes with it
            self._engine._released()
