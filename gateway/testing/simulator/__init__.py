"""mistral.rs protocol SIMULATOR: test and demo equipment, never inference.

Everything it "generates" is labelled text (``"sim-token-3 "``); every response
carries ``x-simulator: mistralrs-protocol-simulator``. It speaks the wire
protocol of ``mistralrs serve`` as written down in the project's reference
(``mistralrs-http.md``): routes, `/v1/models`, SSE chunk bytes (key order,
nulls, usage on the terminal chunk only, ``[DONE]``), keep-alive comments,
error bodies and ``x-request-id``.

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
  flow control. Faults are only different plans.
* Knobs come from constructor defaults, overridden per request by a
  ``[[sim key=value ...]]`` directive in the last user message (or the
  completion ``prompt``) unless ``directives=False``. Unknown keys or bad
  values answer 400 ``simulator: ...`` so a typo never passes silently.
* All shared state sits on one ``State`` behind one lock, because tests read
  it from another thread. Nothing is module-level mutable.
* Deterministic: text, ids (a per-simulator counter), ``created`` (the
  simulator's start second), timings (derived from the knobs) and tool-call
  ids depend only on the request order and knobs. Generated request ids are
  random, as the real server's are.
* Bounds: request head 64 KiB, body 50 MiB (413 like the real server), 32
  pipelined requests, a hang lasts at most 300 s, ``endless_line`` 512 MiB.
"""

from gateway.testing.simulator.core import SimRequest
from gateway.testing.simulator.knobs import (
    DEFAULT_MODEL_ID,
    EMBEDDINGS_FAULTS,
    FAULTS,
    RESPONSES_FAULTS,
    SimKnobs,
)
from gateway.testing.simulator.server import Simulator, main

__all__ = [
    "DEFAULT_MODEL_ID",
    "EMBEDDINGS_FAULTS",
    "FAULTS",
    "RESPONSES_FAULTS",
    "SimKnobs",
    "SimRequest",
    "Simulator",
    "main",
]
