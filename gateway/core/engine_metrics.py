"""The worker's sequence counts, read from its Prometheus text exposition
(mistral.rs >= 0.9.2, reference §12). Pure.

Only three families matter to cancellation confirmation (spec §20):
``mistralrs_sequences_running``, ``mistralrs_sequences_waiting`` (gauges) and
``mistralrs_sequences_completed_total{reason="canceled"}`` (a counter). Each
is summed over its other labels (one series per model). A family counts as
exported when its ``# TYPE`` line or any sample of it is there: a counter
vector nobody has incremented yet exports its ``# TYPE`` line only, which
reads as 0. An exposition without all three (an older pin with ``http_*``
only) is :data:`None`: the worker cannot confirm anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

RUNNING = "mistralrs_sequences_running"
WAITING = "mistralrs_sequences_waiting"
COMPLETED = "mistralrs_sequences_completed_total"
_FAMILIES = (RUNNING, WAITING, COMPLETED)
#: the label pair itself, not a substring of another label's name or value
_CANCELED = re.compile(rb'(?:^|,)\s*reason="canceled"\s*(?:,|$)')
_NAME_END = re.compile(rb"[{\s]")


@dataclass(frozen=True, slots=True)
class EngineCounts:
    running: float
    waiting: float
    #: sequences ended because their request went away, since the worker started
    canceled: float


def parse(text: bytes) -> EngineCounts | None:
    seen: set[str] = set()
    sums = {RUNNING: 0.0, WAITING: 0.0, COMPLETED: 0.0}
    for raw in text.split(b"\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith(b"#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == b"TYPE":
                name = parts[2].decode("latin-1")
                if name in sums:
                    seen.add(name)
            continue
        found = _NAME_END.search(line)
        name_end = found.start() if found else len(line)
        name = line[:name_end].decode("latin-1")
        if name not in sums:
            continue
        seen.add(name)
        labels = b""
        rest = line[name_end:]
        if rest.startswith(b"{"):
            close = rest.rfind(b"}")  # a "}" may stand inside a quoted label value
            if close == -1:
                return None
            labels, rest = rest[1:close], rest[close + 1 :]
        fields = rest.split()
        if not fields:
            return None
        try:
            value = float(fields[0])
        except ValueError:
            return None
        if not math.isfinite(value) or value < 0:  # NaN, infinite or negative: not a count
            return None
        if name == COMPLETED and not _CANCELED.search(labels):
            continue
        sums[name] += value
    if any(f not in seen for f in _FAMILIES):
        return None
    return EngineCounts(sums[RUNNING], sums[WAITING], sums[COMPLETED])
