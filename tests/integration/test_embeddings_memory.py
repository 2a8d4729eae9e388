"""Big embeddings answers through a real ``serve`` process, in bounded memory (spec §14).

The simulator (its own process, so that the callers here are never starved of
the GIL) answers 770 inputs x 8192 dimensions: ~60 MB of float text, under
``max_stream_bytes``. The gateway's peak RSS (``VmHWM``, reset before the
requests; sampled ``VmRSS`` where the kernel refuses the reset) is compared with
its RSS before them, in units of one answer (the four, in MB):

* one answer: at most 1.5 answers over the baseline: the worker's bytes, held
  once while they are checked and then sent as they are, in 1 MiB pieces (it
  was ~8.5 with the answer parsed whole, then ~2 with the reply serialized
  into one payload beside the held bytes);
* four at once: at most 300 MB (issue 25's budget; four held, ~4 answers,
  and little else; it was ~11 answers, then ~5);
* afterwards RSS is back within 48 MB of the baseline.

The four answers arrive together, so each is held whole until it is checked
(the worker's JSON is validated before it is returned): four answers' worth is
the floor of this scenario whatever the reader does.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.procs import Child, start_simulator
from gateway.testing.harness import default_policy, write_config
from tests.support.process import Served, serve, wait_ready
from tests.support.stack import issuers

INPUTS, DIMS = 770, 8192
MB = 1 << 20
ALIAS = "gemma-4-mm"


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} in /proc/{pid}/status")


class Peak:
    """Peak RSS of ``pid`` from now on: ``VmHWM`` after resetting it, else sampled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._hwm = _reset_hwm(pid)
        self._max = status_kb(pid, "VmRSS")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self._max = max(self._max, status_kb(self.pid, "VmRSS"))

    def bytes(self) -> int:
        self._stop.set()
        self._thread.join(5)
        sampled = self._max * 1024
        return max(sampled, status_kb(self.pid, "VmHWM") * 1024) if self._hwm else sampled


def _reset_hwm(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@contextmanager
def simulator(tmp: Path) -> Iterator[Child]:
    child = start_simulator(tmp, dict(os.environ))
    try:
        yield child
    finally:
        child.stop()


@contextmanager
def gateway(tmp: Path, sim_port: int) -> Iterator[Served]:
    policy = default_policy("acme", endpoints=["embeddings", "models"])
    config = write_config(
        tmp,
        upstream_port=sim_port,
        policies={"acme": policy},
        issuers=issuers(),
        limits={"max_embedding_inputs": 1024},
        upstream={"first_event_timeout_s": 120, "idle_timeout_s": 120, "total_timeout_s": 180},
    )
    with serve(config, tmp) as served:
        with httpx.Client(base_url=served.url) as client:
            wait_ready(client, 20)
        yield served


def _settled_rss(pid: int, timeout_s: float = 10) -> int:
    """RSS once it stops falling (freed memory is given back as requests end)."""
    deadline = time.monotonic() + timeout_s
    last = status_kb(pid, "VmRSS")
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = status_kb(pid, "VmRSS")
        if now >= last:
            return now * 1024
        last = now
    return last * 1024


def _caller(served: Served) -> Callable[[], tuple[int, int]]:
    token = served.dev_token()
    body = {
        "model": ALIAS,
        "input": [f"x [[sim dims={DIMS}]]"] + [f"input {i}" for i in range(INPUTS - 1)],
    }

    def call() -> tuple[int, int]:
        headers = {"authorization": f"Bearer {token}"}
        with httpx.Client(base_url=served.url, headers=headers, timeout=180) as client:
            response = client.post("/v1/embeddings", json=body)
        return response.status_code, len(response.content)

    return call


def _concurrently(call: Callable[[], tuple[int, int]], n: int) -> list[tuple[int, int]]:
    results: list[tuple[int, int]] = []
    threads = [threading.Thread(target=lambda: results.append(call())) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    return results


def test_big_embeddings_answers_stay_in_bounded_memory(tmp_path: Path) -> None:
    with simulator(tmp_path) as sim, gateway(tmp_path, sim.port) as served:
        pid, call = served.proc.pid, _caller(served)
        with httpx.Client(base_url=served.url, timeout=30) as client:
            small = client.post(
                "/v1/embeddings",
                json={"model": ALIAS, "input": "warm up"},
                headers={"authorization": f"Bearer {served.dev_token()}"},
            )
        assert small.status_code == 200
        baseline = _settled_rss(pid)

        peak = Peak(pid)
        status, size = call()
        one = peak.bytes() - baseline
        assert status == 200 and 55 * MB < size < 64 * MB, (status, size)
        after_one = _settled_rss(pid) - baseline

        peak = Peak(pid)
        results = _concurrently(call, 4)
        four = peak.bytes() - baseline
        assert results == [(200, size)] * 4
        after_four = _settled_rss(pid) - baseline

    figures = (
        f"baseline {baseline / MB:.0f} MB, answer {size / MB:.1f} MB; "
        f"one: peak +{one / MB:.0f} MB (after +{after_one / MB:.0f}); "
        f"four: peak +{four / MB:.0f} MB (after +{after_four / MB:.0f})"
    )
    print(figures)
    assert one <= 1.5 * size, figures
    assert four <= 300 * MB, figures
    assert after_one <= 48 * MB and after_four <= 48 * MB, figures
