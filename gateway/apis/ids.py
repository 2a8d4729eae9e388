"""The ids callers see are the gateway's (spec §21, §24). Pure.

A worker numbers what it makes: the answer's id, and inside it Responses
output items (``msg_``, ``fc_``, ``rs_``…), tool calls (``call_…``) and, on
the Anthropic route, tool uses (``toolu_…``). Some builds use a counter, so
one tenant could count another's requests; every one of these ids is
replaced before the caller sees it:

- the answer's own id (:func:`gateway_id`, once per request);
- the ids inside it (:class:`InnerIds`, one table per answer): each worker id
  gets a random one the first time it appears and the same one every time
  after, so one item's id is the same in ``response.output_item.added``,
  its content events, ``output_item.done`` and the terminal response, and a
  tool call's id is the same in every chunk and in the collected answer.

Nothing maps them back, by decision: the worker keeps nothing between
requests (every Responses request reaches it with ``store: false`` and the
conversation expanded by the gateway, spec §17; chat and Messages are
stateless), so it never needs its own ids again. What a caller returns (a
tool result's ``tool_call_id``, ``call_id`` or ``tool_use_id``, re-sent
assistant turns, a kept conversation's items) names the gateway's ids on
both sides of each pair, and the worker sees them as they are: consistent
within the conversation, which is all a template needs. The gateway keeps no
id table beyond the answer (nothing to expire, nothing to leak).
"""

from __future__ import annotations

import os
import re
from typing import Any

_WORKER_PREFIX = re.compile(r"[a-z]{1,8}_")


def gateway_id(prefix: str) -> str:
    """``prefix`` and 96 random bits in hex: unguessable, never the worker's."""
    return prefix + os.urandom(12).hex()


class InnerIds:
    """The worker's ids inside one answer and their replacements (module docstring)."""

    __slots__ = ("_mine",)

    def __init__(self) -> None:
        self._mine: dict[str, str] = {}

    def swap(self, worker: Any, prefix: str | None = None) -> Any:
        """The gateway's id for the worker's ``worker`` (a non-string is returned
        as it is: the grammar did not check it, and it names nothing). A new id
        takes ``prefix``, or the worker's own (``msg_``, ``fc_``…), or ``item_``."""
        if not isinstance(worker, str):
            return worker
        mine = self._mine.get(worker)
        if mine is None:
            if prefix is None:
                match = _WORKER_PREFIX.match(worker)
                prefix = match.group(0) if match else "item_"
            mine = self._mine[worker] = gateway_id(prefix)
        return mine

    def swap_key(self, holder: Any, key: str, prefix: str | None = None) -> None:
        """``holder[key]`` swapped in place, when ``holder`` is an object holding it."""
        if isinstance(holder, dict) and key in holder:
            holder[key] = self.swap(holder[key], prefix)

    def __len__(self) -> int:
        return len(self._mine)
