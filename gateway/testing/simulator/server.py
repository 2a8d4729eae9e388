"""The :class:`Simulator`: a background thread or ``serve_forever``, and the
thread-safe observations and controls tests use (the CLI is cli.py)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import ipaddress
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.testing.simulator.broker import SESSION_TTL_S, AgentRun, ApprovalRecord
from gateway.testing.simulator.core import Core
from gateway.testing.simulator.knobs import DEFAULT_MODEL_ID, MODELS_FAULTS, SimKnobs
from gateway.testing.simulator.metrics import MODES as METRICS_MODES
from gateway.testing.simulator.metrics import EngineMetrics
from gateway.testing.simulator.state import SimRequest, State
from gateway.testing.simulator.transport import Connection

_READY_TIMEOUT_S = 10.0


def _require_loopback(host: str) -> None:
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the simulator binds loopback only, not {host!r}")


def _id_of(entry: str | tuple[str, str]) -> str:
    return entry if isinstance(entry, str) else entry[0]


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop where it is installed (as the gateway runs), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


class Simulator:
    """A mistral.rs protocol simulator on loopback (see the module docstring).

    Use ``start()``/``stop()`` to run it on its own thread and event loop (tests),
    or ``await serve_forever()`` on the current loop (CLI). Knob arguments are the
    defaults of every response; ``directives=False`` ignores ``[[sim ...]]``.

    ``model_ids`` serves several routes (a ``from-config`` worker); the first is
    the default. An entry is a model id (a ``chat`` route) or ``(model id,
    kind)``, kind one of ``chat``, ``embeddings``, ``image``, ``speech``
    (routes.py). ``model_id`` is the one-route shorthand (ignored when
    ``model_ids`` is given, which must then start with it if it is not the
    default value). ``id_seed`` makes the Responses ids (``resp_``, ``msg_``,
    ``fc_``, ``call-``), session, approval and file ids reproducible; by
    default each simulator draws its own, so two simulators never hand out
    the same id. Any other keyword is a knob (``SimKnobs``: ``reasoning``,
    ``agent``, ``files``, ``audio_bytes``...).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_id: str = DEFAULT_MODEL_ID,
        model_ids: Sequence[str | tuple[str, str]] | None = None,
        id_seed: int | None = None,
        chunks: int = 8,
        delay_ms: float = 0,
        keepalive_ms: float = 10_000,
        directives: bool = True,
        first_delay_ms: float = 0,
        split: int = 0,
        unicode: bool = False,
        finish: str = "stop",
        tool_call: bool = False,
        extras: bool = False,
        fault: str | None = None,
        status: int | None = None,
        pad: int = 0,
        terminal: str = "completed",
        dims: int = 8,
        text: str | None = None,
        session_ttl_s: float = SESSION_TTL_S,
        **more: Any,
    ) -> None:
        _require_loopback(host)
        if model_ids is None:
            model_ids = [model_id]
        elif model_id != DEFAULT_MODEL_ID and (not model_ids or _id_of(model_ids[0]) != model_id):
            raise ValueError("model_id must be the first of model_ids (or left out)")
        knobs = SimKnobs(
            chunks=chunks,
            delay_ms=delay_ms,
            first_delay_ms=first_delay_ms,
            keepalive_ms=keepalive_ms,
            split=split,
            unicode=unicode,
            finish=finish,
            tool_call=tool_call,
            status=status,
            extras=extras,
            fault=fault,
            pad=pad,
            terminal=terminal,
            dims=dims,
            text=text,
            **more,
        )
        self._host = host
        self._port = port
        seed = secrets.randbits(64) if id_seed is None else id_seed
        self._state = State(list(model_ids), knobs, directives, seed, session_ttl_s)
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    # -- addresses

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def model_id(self) -> str:
        """The default (first) route."""
        return self._state.model_id

    @property
    def model_ids(self) -> tuple[str, ...]:
        return self._state.routes.ids

    @property
    def id_seed(self) -> int:
        return self._state.id_seed

    # -- running

    async def serve_forever(self) -> None:
        """Serve on the running loop until cancelled."""
        await self._serve(*await self._bind())

    async def _bind(self) -> tuple[asyncio.Server, Core]:
        core = Core(self._state)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: Connection(core), self._host, self._port, backlog=1024
        )
        self._port = server.sockets[0].getsockname()[1]
        self._listening.set()
        return server, core

    async def _serve(self, server: asyncio.Server, core: Core) -> None:
        try:
            await server.serve_forever()
        finally:
            server.close()
            # A connection accepted just before the close gets connection_made,
            # and its request task, a loop turn or two later: sweep until a
            # turn finds nothing new (bounded).
            for _ in range(20):
                await asyncio.sleep(0)
                conns, tasks = list(core.connections), list(core.tasks)
                for conn in conns:
                    conn.shutdown()
                for task in tasks:
                    task.cancel()
                if tasks:
                    await asyncio.wait(tasks, timeout=5)
                if not conns and not tasks:
                    break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 5)

    def start(self) -> None:
        """Serve on a background thread; return once listening."""
        if self._thread is not None:
            raise RuntimeError("simulator already started")
        self._thread = threading.Thread(target=self._thread_main, name="sim", daemon=True)
        self._thread.start()
        if not self._listening.wait(_READY_TIMEOUT_S):
            raise RuntimeError("simulator did not start listening in time")
        if self._error is not None:
            raise RuntimeError("simulator failed to start") from self._error

    def _thread_main(self) -> None:
        loop = loop_factory()()
        self._loop = loop
        try:
            self._main = loop.create_task(self.serve_forever())
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            self._listening.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        loop, main, thread = self._loop, self._main, self._thread
        if loop is not None and main is not None:
            with contextlib.suppress(RuntimeError):  # loop already closed
                loop.call_soon_threadsafe(main.cancel)
        if thread is not None:
            thread.join(_READY_TIMEOUT_S)

    # -- observations and controls (thread-safe)

    def requests(self) -> list[SimRequest]:
        with self._state.cond:
            return [dataclasses.replace(r) for r in self._state.requests]

    def reset(self) -> None:
        """Back to as constructed: no recorded requests, peak = current, every route
        loaded and listed once, the Responses store, the agentic sessions, runs,
        recorded approval decisions and remembered sessions empty (approvals being
        waited for stay pending).

        The completion-id counter keeps counting, so ids stay unique per simulator.
        """
        st = self._state
        with st.cond:
            st.requests.clear()
            st.max_active = st.active
            st.knobs = st.initial_knobs
            st.routes.reset()
            st.models_fault = None
            st.engine = EngineMetrics()
            st.store.clear()
            st.approvals.clear()
            st.sessions.clear()
            st.agent_runs.clear()

    @property
    def active_streams(self) -> int:
        with self._state.cond:
            return self._state.active

    @property
    def max_active_streams(self) -> int:
        with self._state.cond:
            return self._state.max_active

    def set_status(self, route: str, status: str | None) -> None:
        """``route``'s status in ``/v1/models``: loaded, unloaded, reloading, or None
        (not listed: requests naming it get the unknown-model error)."""
        with self._state.cond:
            self._state.routes.set_status(route, status)
            self._state.cond.notify_all()

    def set_entries(self, route: str, count: int) -> None:
        """List ``route`` ``count`` times (0..16) in ``/v1/models``."""
        with self._state.cond:
            self._state.routes.set_entries(route, count)
            self._state.cond.notify_all()

    def status(self, route: str) -> str | None:
        with self._state.cond:
            return self._state.routes.get(route).status

    def set_model_status(self, status: str | None) -> None:
        """:meth:`set_status` of the default route."""
        self.set_status(self.model_id, status)

    def set_model_entries(self, count: int) -> None:
        """:meth:`set_entries` of the default route."""
        self.set_entries(self.model_id, count)

    def stored_response(self, response_id: str) -> dict[str, Any] | None:
        """What ``GET /v1/responses/{id}`` would answer now (a copy; None: 404)."""
        with self._state.cond:
            return copy.deepcopy(self._state.store.get(response_id, time.monotonic()))

    def has_history(self, response_id: str) -> bool:
        """Whether ``previous_response_id=response_id`` would find a conversation."""
        with self._state.cond:
            return self._state.store.history(response_id, time.monotonic()) is not None

    def set_models_fault(self, fault: str | None) -> None:
        if fault is not None and fault not in MODELS_FAULTS:
            raise ValueError(f"fault must be one of {sorted(MODELS_FAULTS)} or None")
        with self._state.cond:
            self._state.models_fault = fault

    def set_metrics(self, mode: str = "engine", confirm_delay_s: float | None = 0.0) -> None:
        """How ``/metrics`` answers and how long a canceled stream keeps running
        there (None: it never ends); see ``gateway/testing/simulator/metrics.py``."""
        if mode not in METRICS_MODES:
            raise ValueError(f"mode must be one of {sorted(METRICS_MODES)}")
        with self._state.cond:
            engine = self._state.engine
            engine.mode, engine.confirm_delay_s = mode, confirm_delay_s

    @property
    def metrics_requests(self) -> int:
        """How many times ``/metrics`` was read."""
        with self._state.cond:
            return self._state.engine.requests

    @property
    def canceled_running(self) -> int:
        """Canceled streams the simulated engine has not noticed yet."""
        with self._state.cond:
            return len(self._state.engine.pending)

    # -- agentic runs (agents.py; thread-safe copies)

    def agent_runs(self) -> list[AgentRun]:
        """Every agentic chat request played, in order: the session id it used and the one
        it was sent, its permission, each round's outcome, the approvals it announced, the
        one pending when its client went away."""
        with self._state.cond:
            return copy.deepcopy(list(self._state.agent_runs))

    def approval_decisions(self) -> list[ApprovalRecord]:
        """Every ``POST /v1/agent/approvals/{id}`` received, in order, with what it answered."""
        with self._state.cond:
            return copy.deepcopy(list(self._state.approvals.records))

    def pending_approvals(self) -> list[str]:
        """The approval ids a run is waiting on now."""
        with self._state.cond:
            return list(self._state.approvals.pending)

    def sessions(self) -> list[str]:
        """The agentic session ids the simulated worker keeps now."""
        with self._state.cond:
            return self._state.sessions.ids(time.monotonic())

    def set_knobs(self, **changes: Any) -> None:
        """Change the default knobs of later requests (same names as the constructor)."""
        with self._state.cond:
            self._state.knobs = dataclasses.replace(self._state.knobs, **changes)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Poll ``predicate`` until true or ``timeout`` seconds; woken by every state change."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._state.cond:
                self._state.cond.wait(min(remaining, 0.05))
        return True
