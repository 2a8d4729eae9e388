"""The per-stage CPU budget of one streamed chat request (issue 26).

Run: ``.venv/bin/python -m bench.budget`` (``make bench`` runs it). It runs
``bench.run``'s ``latency`` scenario (C=1, 16 chunks) with ``--requests``
requests while py-spy samples the gateway at 1 kHz, then splits the
gateway's measured CPU per request over the stages of the request below,
by the share of samples each stage holds, and checks each stage against
its budget. ``--stacks FILE --cpu-us N`` re-reads a saved py-spy file.

A sample belongs to the stage of the innermost frame that names one (py-spy
sees coroutine stacks only from the coroutine running, so a sample is read
from its leaf upwards). What no stage names -- uvloop's own C code: epoll,
socket reads and writes, callbacks -- is ``event loop``. py-spy's overhead
(``--nonblocking``: no pauses) is in the CPU figure, a few percent. The
threads other than the event loop's are measured exactly from
``/proc/<pid>/task`` and shown as one row.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

#: (stage, frame names that mark it, budget in µs per request), in the request's
#: order. The budgets sum to issue 26's 500 µs for this scenario.
STAGES: tuple[tuple[str, tuple[str, ...], float], ...] = (
    (
        "http parse",
        ("LimitedHttpProtocol.", "HttpToolsProtocol.", "RequestResponseCycle.receive",
         "request_id_from", "watch_disconnect", "GatewayApp._origin", "header ("),
        30,
    ),
    ("auth", ("Authenticator.", "bearer_value", "authorization_values"), 10),
    (
        "plan",
        ("ChatApi.", "ResponsesApi.", "MessagesApi.", "read_body", "parse_json", "json_depth_ok",
         "body_pieces", "obj.<locals>", "list_of.<locals>", "output_bound", "prompt_token_bound",
         "check_framing", "stream_flags", "InferenceEndpoint._plan"),
        35,
    ),
    ("limits", ("LimitsStore.", "judge", "TenantLimits.", "limits_store_call", "refill"), 20),
    ("admission", ("Admission.", "FairQueueCore.", "Permit.", "_permit (", "request_weight"), 20),
    (
        "upstream request",
        ("Upstream.open_stream", "WirePool.", "WireConnection.write", "WireConnection.read_head",
         "WireConnection.begin", "WireConnection._wait", "body_layout", "layout (",
         "BodyProducer.", "_check_head", "RouteTable.resolve", "resolve (", "_attempt.<locals>"),
        45,
    ),
    (
        "relay per chunk",
        ("Relay._drain", "Relay._pump", "StreamValidator.", "ChunkGrammar.", "ChunkDialect.on_item",
         "ChunkDialect.observe", "UpstreamStream.", "WireConnection.data_received",
         "WireConnection.on_", "Deadline.", "Relay.stream_to"),
        110,
    ),
    (
        "caller writes",
        ("RequestResponseCycle.send", "_ResponseHeaders.", "Relay._send", "Relay.end",
         "CorkedTransport."),
        40,
    ),
    (
        "settle",
        ("settle (", "finish (", "_record_timings", "_account (", "decide (", "ChunkDialect.report",
         "usage_of", "as_ms", "_trace ("),
        35,
    ),
    ("receipt (loop side)", ("ReceiptWriter.", "receipt_line", "ChainHead."), 15),
    (
        "access log + metrics",
        ("GatewayApp._record", "Logger.", "Handler.", "JsonFormatter.", "LogRecord.",
         "GatewayMetrics.", "Histogram.", "Counter.", "Gauge.", "MutexValue.", "AccessLog."),
        25,
    ),
    (
        "request pipeline",
        ("InferenceEndpoint.", "Exchange.", "pipeline/steps.py", "pipeline/worker.py",
         "GatewayApp.__call__", "_CleanRefusal.", "RequestResponseCycle.run_asgi"),
        40,
    ),
)  # fmt: skip
RATE_HZ = 1000  # bench.run's py-spy rate
LOOP = ("event loop", 55.0)  # uvloop's C code: epoll, socket reads and writes, callbacks
THREADS = ("other threads", 20.0)  # the receipt writer's writes and fsyncs, the executor


def stage_of(frames: list[str]) -> str:
    for frame in reversed(frames):
        for stage, marks, _ in STAGES:
            if any(mark in frame for mark in marks):
                return stage
    return LOOP[0]


def split(stacks: Path, busy_samples: float) -> Counter[str]:
    """Samples of the event loop's thread per stage, from py-spy's raw output.

    Other threads' samples are left out: their CPU is measured exactly (and a
    thread blocked in fsync is sampled as busy). Without pausing the process
    py-spy also samples some of the loop's idle ``epoll_wait`` as busy: the
    samples beyond ``busy_samples`` (the loop's measured CPU times the rate) are
    taken off the event loop's row, where the idle waits fall.
    """
    counts: Counter[str] = Counter()
    for line in stacks.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit() and "Thread._bootstrap" not in stack:
            counts[stage_of(stack.split(";"))] += int(n)
    idle = sum(counts.values()) - busy_samples
    if idle > 0:
        counts[LOOP[0]] = max(0, counts[LOOP[0]] - round(idle))
    return counts


def table(counts: Counter[str], loop_us: float, threads_us: float) -> tuple[str, bool]:
    total = sum(counts.values()) or 1
    head = f"{'stage':22s} {'µs/request':>10s} {'budget':>7s}  share of loop"
    rows = [head, "-" * len(head)]
    figures = [(stage, loop_us * counts[stage] / total, budget) for stage, _, budget in STAGES]
    figures.append((LOOP[0], loop_us * counts[LOOP[0]] / total, LOOP[1]))
    for stage, us, budget in figures:
        share = f"{100 * counts[stage] / total:4.1f}%"
        rows.append(f"{stage:22s} {us:10.1f} {budget:7.0f}  {share:>6s}  [{_mark(us, budget)}]")
    rows.append(f"{THREADS[0]:22s} {threads_us:10.1f} {THREADS[1]:7.0f}  {'':>6s}  "
                f"[{_mark(threads_us, THREADS[1])}]")  # fmt: skip
    whole = sum(budget for *_, budget in figures) + THREADS[1]
    cpu_us = loop_us + threads_us
    rows.append("-" * len(head))
    rows.append(f"{'total (measured CPU)':22s} {cpu_us:10.1f} {whole:7.0f}  {'':>6s}  "
                f"[{_mark(cpu_us, whole)}]")  # fmt: skip
    met = all(us <= budget for _, us, budget in figures) and cpu_us <= whole
    return "\n".join(rows), met


def _mark(value: float, budget: float) -> str:
    return "ok  " if value <= budget else "MISS"


def measure(requests: int) -> tuple[Path, float, float]:
    """Run the scenario under py-spy: (stacks, loop CPU µs, other threads' µs)."""
    out = Path(tempfile.mkdtemp(prefix="budget-"))
    subprocess.run(
        [sys.executable, "-m", "bench.run", "--only", "latency", "--latency-requests",
         str(requests), "--profile", str(out), "--out", str(out / "run.json")],
        check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    gateway = json.loads((out / "run.json").read_text())["scenarios"]["latency"]["gateway"]
    threads_us = gateway["threads_cpu_s_per_1000"] * 1000
    return out / "latency.txt", gateway["cpu_s_per_1000"] * 1000 - threads_us, threads_us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="(of the saved run too)")
    parser.add_argument("--stacks", type=Path, help="a saved py-spy raw file")
    parser.add_argument("--loop-us", type=float, help="that run's event-loop CPU µs per request")
    parser.add_argument("--threads-us", type=float, default=0.0, help="its other threads' µs")
    args = parser.parse_args(argv)
    if args.stacks is not None:
        if args.loop_us is None:
            parser.error("--stacks needs --loop-us")
        stacks, loop_us, threads_us = args.stacks, args.loop_us, args.threads_us
    else:
        stacks, loop_us, threads_us = measure(args.requests)
    busy = loop_us / 1e6 * args.requests * RATE_HZ
    text, met = table(split(stacks, busy), loop_us, threads_us)
    print("Per-stage CPU of one streamed chat request (C=1, 16 chunks, py-spy at 1 kHz)")
    print(text)
    print(f"\nbudget {'met' if met else 'missed'}; samples: {stacks}")
    return 0  # a report, as bench.run's targets are: MISS lines, not a failed make


if __name__ == "__main__":
    raise SystemExit(main())
