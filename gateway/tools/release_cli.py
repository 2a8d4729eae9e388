"""``mistralrs-gateway release status|set|rollback|clear --config F …`` (spec §18).

Each command opens the configured state store (``open_state``), acts on the
running fleet through it, and closes it: every replica reads the decisions
each second, so a change is applied fleet-wide within 2 s.

- ``status [NAME]`` prints JSON: a list of every configured release, or one
  object for NAME, with keys ``name``, ``stable``, ``canary``,
  ``configured_percent``, ``effective_percent``, ``state`` (``config`` |
  ``override`` | ``rolled_back``), ``arms`` (per arm ``requests``,
  ``failures``, ``ttft_p95_ms``: the gate windows of the replicas that
  published in the last :data:`FRESH_S`), and ``updated`` (unix seconds) of a
  standing decision.
- ``set NAME --percent P``: an override at P (0-100), standing across SIGHUP
  until ``clear``. ``rollback NAME``: percent 0 now (an operator's rollback;
  ``gateway_release_rollbacks_total`` counts only the gates'). ``clear
  NAME``: back to the config. Each prints the release's status afterwards.

Exit 1, with one line on stderr: an unknown NAME, a percent outside 0-100,
or a store that cannot be reached (``state_unavailable``; never the DSN).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from gateway.books.protocols import ArmCounts, ReleaseOverride, ReleaseStore
from gateway.books.state.factory import open_state
from gateway.config import GatewayConfig
from gateway.config.loader import load_config
from gateway.config.releases import ReleaseConfig
from gateway.core.errors import GatewayError

__all__ = ["FRESH_S", "release_status", "run"]

#: replicas publish each second; one silent this long has stopped (or lost the store)
FRESH_S = 30.0
ARMS = ("stable", "canary")


class _Refused(Exception):
    """A command that cannot act: one line for stderr."""


def _arm(by_replica: Mapping[str, Mapping[str, ArmCounts]], arm: str) -> dict[str, object]:
    counts = [arms[arm] for arms in by_replica.values() if arm in arms]
    p95s = [c.ttft_p95_ms for c in counts if c.ttft_p95_ms is not None]
    return {
        "requests": sum(c.requests for c in counts),
        "failures": sum(c.failures for c in counts),
        # A p95 cannot be summed, and the samples behind it are not published.
        # The largest replica's p95 bounds the fleet's from above (95 % of
        # every replica's requests, so of all of them, are at or under it), and
        # each gate judges its own replica: the largest is the one nearest to
        # rolling back.
        "ttft_p95_ms": max(p95s) if p95s else None,
    }


def release_status(
    release: ReleaseConfig,
    decision: ReleaseOverride | None,
    by_replica: Mapping[str, Mapping[str, ArmCounts]],
) -> dict[str, object]:
    """One release's status object, from its config, decision and published figures."""
    if decision is None:
        state, effective = "config", release.canary_percent
    elif decision.state == "rolled_back":
        state, effective = "rolled_back", 0.0
    else:
        state, effective = "override", decision.percent
    status: dict[str, object] = {
        "name": release.name,
        "stable": release.stable,
        "canary": release.canary,
        "configured_percent": release.canary_percent,
        "effective_percent": effective,
        "state": state,
        "arms": {arm: _arm(by_replica, arm) for arm in ARMS},
    }
    if decision is not None:
        status["updated"] = round(decision.updated, 3)
    return status


def _percent(text: str | None) -> float:
    try:
        percent = float(text or "")
    except ValueError:
        percent = math.nan
    if not (math.isfinite(percent) and 0 <= percent <= 100):
        raise _Refused(f"--percent must be a number within 0-100, not {text!r}")
    return percent


def _release(config: GatewayConfig, name: str) -> ReleaseConfig:
    for release in config.releases:
        if release.name == name:
            return release
    known = ", ".join(r.name for r in config.releases) or "none"
    raise _Refused(f"release {name!r} is not configured (configured: {known})")


async def _statuses(
    store: ReleaseStore, config: GatewayConfig, releases: list[ReleaseConfig], now: float
) -> list[dict[str, object]]:
    decisions = await store.overrides()
    figures = await store.figures(now - FRESH_S)
    for name in sorted(set(decisions) - {r.name for r in config.releases}):
        # Left behind by a release removed from the config: it would apply again if re-added.
        print(
            f"warning: a decision stands for release {name!r}, which the config does not "
            "name; `release clear` removes it",
            file=sys.stderr,
        )
    return [release_status(r, decisions.get(r.name), figures.get(r.name, {})) for r in releases]


async def _act(config: GatewayConfig, verb: str, name: str | None, percent: float | None) -> object:
    # An unknown name is refused before the store is opened (clear: see _clearable).
    release = _release(config, name) if name is not None and verb != "clear" else None
    state = open_state(config, os.environ)
    try:
        store, now = state.releases, time.time()
        if verb == "status":
            chosen = config.releases if release is None else [release]
            found = await _statuses(store, config, chosen, now)
            return found if release is None else found[0]
        assert name is not None  # argparse: every verb but status takes NAME
        if verb == "clear":
            release = await _clearable(config, name, store)
            if not await store.clear(name):
                print(f"release {name}: no decision stood; it follows the config", file=sys.stderr)
        elif verb == "set":
            assert percent is not None
            await store.decide(name, "override", percent, now)
        else:
            await store.decide(name, "rolled_back", 0.0, now)
        if release is None:
            return None
        (after,) = await _statuses(store, config, [release], now)
        return after
    finally:
        await state.close()


async def _clearable(config: GatewayConfig, name: str, store: ReleaseStore) -> ReleaseConfig | None:
    """A configured release, or the name of a decision the config no longer names
    (clearing it keeps it from applying if the release comes back)."""
    try:
        return _release(config, name)
    except _Refused:
        if name in await store.overrides():
            return None
        raise


def run(verb: str, config_path: str, name: str | None, percent: str | None = None) -> int:
    config = load_config(Path(config_path))
    try:
        value = _percent(percent) if verb == "set" else None
        result = asyncio.run(_act(config, verb, name, value))
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except GatewayError as exc:
        # Its message is a fixed phrase or names the variable: never the DSN.
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2))
    return 0
