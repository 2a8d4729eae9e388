"""The Prometheus exposition of a registry, off the serving loop (spec §21).

Rendering the text exposition (``generate_latest``) is pure Python over every
series and bucket: milliseconds, and more with more tenants. Done on the event
loop for every scrape, 40 clients scraping ``/metrics`` in a loop raised chat
p50 from 3.8 to 16 ms. Both places that answer a scrape (the ``/metrics``
route, ``gateway/http/routes.py``, and the separate listener,
``listener.py``) ask :meth:`Exposition.render` of the registry's one
:class:`Exposition` (:func:`exposition_of`) instead:

- **Off the loop, one at a time.** A render runs in a worker thread
  (prometheus_client's metrics take their own locks, so the loop keeps
  counting meanwhile); there is never more than one per registry.
- **As fresh as before.** Every scrape is answered by a render that began
  after the scrape arrived, so whatever happened before a scrape is in its
  answer. Scrapes that arrive while a render runs wait for the next one, and
  all of them share it.
- **At a bounded rate.** The next render begins no sooner than
  :data:`MIN_INTERVAL_S` after the last one ended, nor sooner than
  ``1 / MAX_DUTY - 1`` times that render's duration: a client that scrapes
  more often than that waits for its answer (and so scrapes no faster), and
  however many scrape, rendering takes at most :data:`MAX_DUTY` of the time.

These are constants, not config keys (``metrics`` has none that fits): a
Prometheus scrape interval is 15 s or more, so a scraper never waits unless
it scrapes more than twice a second, and nothing a deployment does calls for
another bound.
"""

from __future__ import annotations

import asyncio
import time
import weakref

from prometheus_client import CollectorRegistry, generate_latest

__all__ = ["MAX_DUTY", "MIN_INTERVAL_S", "Exposition", "exposition_of"]

#: the least time from the end of one render to the start of the next
MIN_INTERVAL_S = 0.5
#: the largest share of the time spent rendering, whatever the scrape rate
MAX_DUTY = 0.05

#: each registry's one Exposition; an Exposition holds its registry weakly, so
#: an entry goes with its registry (the app that made it)
_expositions: weakref.WeakKeyDictionary[CollectorRegistry, Exposition] = weakref.WeakKeyDictionary()


def exposition_of(registry: CollectorRegistry) -> Exposition:
    """The registry's one :class:`Exposition` (made on first use)."""
    found = _expositions.get(registry)
    if found is None:
        found = _expositions[registry] = Exposition(registry)
    return found


class Exposition:
    """Renders one registry (held weakly: whoever scrapes it keeps it alive)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        min_interval_s: float = MIN_INTERVAL_S,
        max_duty: float = MAX_DUTY,
    ) -> None:
        self._registry = weakref.ref(registry)
        self._min_interval_s = min_interval_s
        self._gap_per_render_s = 1 / max_duty - 1
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the render the next scrape joins: created, not begun
        self._next: asyncio.Task[bytes] | None = None
        #: the newest render (begun or not); the next one waits for it
        self._last: asyncio.Task[bytes] | None = None
        #: monotonic time before which no render begins
        self._not_before = 0.0
        #: renders finished (tests, and a figure for benchmarks)
        self.renders = 0

    async def render(self) -> bytes:
        """The exposition as of a moment after this call began."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Tasks belong to one loop; a registry outliving its loop starts afresh.
            self._loop, self._next, self._last = loop, None, None
        task = self._next
        if task is None:
            task = loop.create_task(self._render(self._last), name="metrics-exposition")
            task.add_done_callback(_retrieve)
            self._next = self._last = task
        # A scrape that goes away leaves the render to the others waiting for it.
        return await asyncio.shield(task)

    async def _render(self, previous: asyncio.Task[bytes] | None) -> bytes:
        if previous is not None:
            await asyncio.wait([previous])  # its outcome is its own scrapes' business
        delay = self._not_before - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        # Begun: a scrape from now on may have seen something this render misses.
        self._next = None
        registry = self._registry()
        if registry is None:
            raise RuntimeError("the registry is gone")
        began = time.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(None, generate_latest, registry)
        finally:
            ended = time.monotonic()
            self.renders += 1
            gap = max(self._min_interval_s, (ended - began) * self._gap_per_render_s)
            self._not_before = ended + gap


def _retrieve(task: asyncio.Task[bytes]) -> None:
    """Mark a failed render's exception as seen (every scrape waiting got it)."""
    if not task.cancelled():
        task.exception()
