"""mistral.rs protocol SIMULATOR: test and demo equipment, never inference.

Everything it "generates" is labelled text (``"sim-token-3 "``); every response
carries ``x-simulator: mistralrs-protocol-simulator``. It speaks the wire
protocol of ``mistralrs serve`` / ``mistralrs from-config`` as written down in
the project's reference (``mistralrs-http.md``) and source findings
(``mistralrs-source.md``): routes, ``/v1/models`` with one or more models,
chat and completion SSE chunk bytes (key order, nulls, usage on the terminal
chunk only, ``[DONE]``), the Responses API's named events, resources and
store (``/v1/responses``, ``GET``/``DELETE /v1/responses/{id}``, cancel),
the Anthropic Messages API (``/v1/messages`` events and ``ping``s,
``/v1/messages/count_tokens``), embeddings, keep-alive comments, error
bodies and ``x-request-id``; and from ``mistralrs-agents-media.md``: agentic
chat runs (tool rounds, ``agentic_tool_call_progress``,
``agentic_tool_approval_required`` answered over ``POST
/v1/agent/approvals/{id}``, ``file_produced``, sessions), image generation
(real PNGs) and speech (real WAV / PCM) on routes of those kinds.

Modules: knobs.py (knobs, directives, fault sets), plans.py (step types, the
shared envelope and its faults), chat.py / responses.py (+ responses_input.py)
/ messages.py (+ messages_input.py) / embeddings.py / images.py (+ png.py) /
speech.py (+ wav.py) (one dialect each, pure), agents.py (agentic chat runs,
pure; + agent_plan.py the ``agent`` knob, agent_tools.py the tools' data,
agent_input.py the request's agentic fields, agent_notes.py what a plan tells
and asks the core), routes.py (the served models and their kinds), store.py
(the Responses store), broker.py (the approval broker, agentic sessions and
the records of runs and decisions), state.py (shared state and the recorded
requests), handling.py (what handlers share), handlers.py (one handler per
route) with media_handlers.py and agent_handlers.py, channel.py (the parsed
request and what the core needs of a connection), core.py (recording,
routing, playing) with agent_core.py (answering an agentic plan's notes,
approval waits), transport.py (the connection), server.py (``Simulator``),
cli.py (the command line). No module imports one that imports it back, not
even for type checking: the core names the connection only as a
``channel.Channel``, and handlers take the ``state.State`` that core.py and
server.py share. No module imports the rest of ``gateway``.

Theory of operation
-------------------
* One ``asyncio.Protocol`` per TCP connection, parsed by ``httptools``. Reading
  never pauses while a response is being written, so a client's FIN or RST
  reaches ``connection_lost`` at once; that cancels the response task of a
  streamed request (mistral.rs stops a stream when its receiver goes) but not
  of a non-streamed one (mistral.rs keeps generating those).
* A response is a *plan*: a pure generator of steps (head, data, pause, end,
  abort, hang, endless) built from the request and its knobs. One executor
  plays plans: chunked framing, keep-alive comments during pauses, ``split``,
  flow control. Faults are only different plans. A plan that depends on
  something outside it (an approval decision) yields a question
  (agent_notes.py) that the core answers, awaiting it as a ``Wait`` step
  during which keep-alives go on, before the plan resumes.
* Knobs come from constructor defaults, overridden per request by a
  ``[[sim key=value ...]]`` directive in the last user message (the
  completion ``prompt``; the Responses string input or last user item; the
  last Anthropic user turn with text; any embeddings string input) unless
  ``directives=False``. Unknown keys, bad values, or a fault the route does
  not implement answer 400 ``simulator: ...`` so a typo never passes
  silently.
* Several routes: ``Simulator(model_ids=[a, (b, "image"), (c, "speech")])``
  serves each (the first is ``default``); a request's ``model`` picks its
  route, and every inference, Responses, embeddings, image or speech request
  records the ``model`` it named. A route of another kind answers with the
  engine's category error.
* All shared state sits on one ``State`` behind one lock, because tests read
  it from another thread. Nothing is module-level mutable.
* Deterministic: text, ids (a per-simulator counter), ``created`` (the
  simulator's start second), timings (derived from the knobs) and tool-call
  ids depend only on the request order and knobs. Responses ids also mix in
  the simulator's ``id_seed`` (random unless given), so two simulators never
  share one; so do session, approval, file and image ids. Generated request
  ids are random, as the real server's are.
* Nothing is written to disk: an image asked for as ``Url`` gets a file name
  only (the real worker would write it into its working directory).
* Bounds: request head 64 KiB, body 50 MiB (413 like the real server), 32
  pipelined requests, a hang lasts at most 300 s, ``endless_line`` 512 MiB,
  an approval wait 600 s, an ``agent`` plan 64 rounds, 128 agentic sessions
  and remembered sessions, 10000 recorded runs and decisions, 4096 announced
  or queued approval ids, images 4096 x 4096, produced files 64 MiB, speech
  bodies 256 MiB (made while written).
"""

from gateway.testing.simulator.broker import AgentRun, ApprovalRecord, RoundRecord
from gateway.testing.simulator.cli import main
from gateway.testing.simulator.knobs import (
    AGENT_FAULTS,
    AGENTIC_CHAT_FAULTS,
    COUNT_TOKENS_FAULTS,
    DEFAULT_MODEL_ID,
    EMBEDDINGS_FAULTS,
    FAULTS,
    IMAGES_FAULTS,
    MESSAGES_FAULTS,
    RESPONSES_FAULTS,
    SPEECH_FAULTS,
    SimKnobs,
)
from gateway.testing.simulator.server import Simulator
from gateway.testing.simulator.state import SimRequest

__all__ = [
    "AGENTIC_CHAT_FAULTS",
    "AGENT_FAULTS",
    "COUNT_TOKENS_FAULTS",
    "DEFAULT_MODEL_ID",
    "EMBEDDINGS_FAULTS",
    "FAULTS",
    "IMAGES_FAULTS",
    "MESSAGES_FAULTS",
    "RESPONSES_FAULTS",
    "SPEECH_FAULTS",
    "AgentRun",
    "ApprovalRecord",
    "RoundRecord",
    "SimKnobs",
    "SimRequest",
    "Simulator",
    "main",
]
