"""Chain anchors (spec §24): every ``audit.anchor_interval_s`` a replica records
its receipt chain's head on disk -- ``replica``, ``seq``, ``sha256`` of the last
line fsynced (``ReceiptWriter.durable``) -- in the state store, and shows the
seq as ``gateway_receipts_chain_seq{replica}``.

Why: links only show what was changed or removed *between* lines; lines
deleted from a chain's end leave a whole, shorter chain. ``receipts verify
--anchors`` holds each chain against its last anchor and reports one that
ends before it as ``truncated``.

- Only a head that moved is recorded (an idle replica makes no state call).
- Never a line a crash could still take: the head is what was fsynced, so a
  SIGKILL or a power loss cannot make an honest chain shorter than its anchor.
- A store that fails is logged once per episode and retried at the next
  interval; the gauge follows the file whatever the store does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.books.protocols import AnchorStore
from gateway.books.receipts import ReceiptWriter
from gateway.config import GatewayConfig
from gateway.core.errors import GatewayError
from gateway.observe.metrics import GatewayMetrics

log = logging.getLogger("gateway.receipts")


class ChainAnchors:
    def __init__(
        self,
        receipts: ReceiptWriter,
        store: AnchorStore,
        replica: str,
        *,
        interval_s: float,
        show_seq: Callable[[int], None] = lambda seq: None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._receipts = receipts
        self._store = store
        self._replica = replica
        self._interval_s = interval_s
        self._show_seq = show_seq
        self._wall = wall
        #: the head the store holds (None: nothing recorded by this process yet)
        self.recorded: tuple[int, str] | None = None
        self._failing = False

    async def record(self) -> bool:
        """Record the head if it moved; whether the store holds the current head."""
        head = self._receipts.durable
        if head is None:
            return True  # no line yet: nothing to anchor
        self._show_seq(head[0])
        if head == self.recorded:
            return True
        try:
            await self._store.anchor(self._replica, head[0], head[1], self._wall())
        except GatewayError as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "receipts: the chain's anchor was not recorded (%s); retrying", exc.code
                )
            return False
        if self._failing:
            self._failing = False
            log.info("receipts: chain anchors recorded again")
        self.recorded = head
        return True

    async def run(self) -> None:
        """Every ``interval_s`` until cancelled (the runtime's background task)."""
        while True:
            await asyncio.sleep(self._interval_s)
            await self.record()


def start_anchors(
    receipts: ReceiptWriter, store: AnchorStore, config: GatewayConfig, metrics: GatewayMetrics
) -> asyncio.Task[None]:
    """The anchoring task (the runtime keeps it with its background tasks)."""
    replica = config.state.replica
    anchors = ChainAnchors(
        receipts,
        store,
        replica,
        interval_s=config.audit.anchor_interval_s,
        show_seq=metrics.receipts_chain_seq.labels(replica).set,
    )
    return asyncio.create_task(anchors.run(), name="receipt-anchors")
