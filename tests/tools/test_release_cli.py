"""``mistralrs-gateway release status|set|rollback|clear`` (spec §18) on both
state backends: what each command writes is what a replica reads from the
store, status sums what the replicas published in the last 30 s, and every
refusal is exit 1 with one line on stderr that never shows the DSN."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.books.protocols import ArmCounts, ReleaseOverride
from gateway.books.state.factory import open_state
from gateway.config.loader import load_config
from gateway.testing.harness import default_policy, write_config
from gateway.tools.cli import main
from gateway.tools.release_cli import FRESH_S
from tests.support.postgres import PostgresServer
from tests.support.stack import issuers

OLD = "/srv/mosaic-models/" + "a" * 64
NEW = "/srv/mosaic-models/" + "b" * 64
EMBED_OLD = "/srv/mosaic-models/" + "c" * 64
EMBED_NEW = "/srv/mosaic-models/" + "d" * 64
DSN_ENV = "RELEASE_TEST_STATE_DSN"
KEYS = {"name", "stable", "canary", "configured_percent", "effective_percent", "state", "arms"}
ARM_KEYS = {"requests", "failures", "ttft_p95_ms"}
NO_TRAFFIC = {"requests": 0, "failures": 0, "ttft_p95_ms": None}

#: (exit code, the JSON printed or None, stderr)
Result = tuple[int, Any, str]
Run = Callable[..., Result]


def write(tmp: Path, state: dict[str, Any] | None = None) -> Path:
    return write_config(
        tmp,
        upstream_port=1234,
        issuers=issuers(),
        policies={"acme": default_policy("acme", models={"chat": "release:chat"})},
        upstreams=[
            {"name": "old", "base_url": "http://127.0.0.1:1234", "routes": [OLD, EMBED_OLD]},
            {"name": "new", "base_url": "http://127.0.0.1:1235", "routes": [NEW, EMBED_NEW]},
        ],
        releases=[
            {"name": "chat", "stable": OLD, "canary": NEW, "canary_percent": 5},
            {"name": "embed", "stable": EMBED_OLD, "canary": EMBED_NEW, "canary_percent": 0},
        ],
        **({} if state is None else {"state": state}),
    )


async def _overrides(config: Path) -> dict[str, ReleaseOverride]:
    state = open_state(load_config(config), os.environ)
    try:
        return await state.releases.overrides()
    finally:
        await state.close()


def overrides(config: Path) -> dict[str, ReleaseOverride]:
    """What every replica reads from the store."""
    return asyncio.run(_overrides(config))


def publish(config: Path, replica: str, arms: dict[str, ArmCounts], age_s: float = 0) -> None:
    """One replica's window, as its runtime publishes it, ``age_s`` ago."""

    async def work() -> None:
        state = open_state(load_config(config), os.environ)
        try:
            await state.releases.publish(replica, {"chat": arms}, time.time() - age_s)
        finally:
            await state.close()

    asyncio.run(work())


@pytest.fixture(params=["sqlite", "postgres"])
def config(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if request.param == "sqlite":
        return write(tmp_path)
    monkeypatch.setenv(DSN_ENV, request.getfixturevalue("postgres_dsn"))
    return write(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV})


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def run(config: Path, verb: str, *rest: str) -> Result:
        code = main(["release", verb, "--config", str(config), *rest])
        out, err = capsys.readouterr()
        return code, json.loads(out) if out.strip() else None, err

    return run


def test_status_lists_every_release_as_configured(config: Path, run: Run) -> None:
    code, out, err = run(config, "status")
    assert (code, err) == (0, "")
    assert [s["name"] for s in out] == ["chat", "embed"]
    chat = out[0]
    assert set(chat) == KEYS, "no updated without a decision"
    assert (chat["stable"], chat["canary"]) == (OLD, NEW)
    assert (chat["configured_percent"], chat["effective_percent"], chat["state"]) == (
        5,
        5,
        "config",
    )
    assert chat["arms"] == {"stable": NO_TRAFFIC, "canary": NO_TRAFFIC}


def test_set_rollback_clear_reach_the_store_and_status(config: Path, run: Run) -> None:
    before = time.time()
    code, out, err = run(config, "set", "chat", "--percent", "25")
    assert (code, err) == (0, "")
    assert (out["name"], out["state"], out["effective_percent"]) == ("chat", "override", 25)
    assert set(out) == KEYS | {"updated"} and out["updated"] >= before - 1
    (stood,) = overrides(config).values()
    assert (stood.name, stood.state, stood.percent) == ("chat", "override", 25.0)
    assert stood.updated == pytest.approx(out["updated"], abs=0.001)

    code, out, _ = run(config, "rollback", "chat")
    assert code == 0
    assert (out["state"], out["effective_percent"], out["configured_percent"]) == (
        "rolled_back",
        0,
        5,
    )
    assert overrides(config)["chat"].state == "rolled_back"
    code, one, _ = run(config, "status", "chat")
    assert code == 0 and one == out, "status NAME: the one object"
    code, listed, _ = run(config, "status")
    assert [s["state"] for s in listed] == ["rolled_back", "config"], "the other is untouched"

    code, out, err = run(config, "clear", "chat")
    assert (code, err) == (0, "")
    assert (out["state"], out["effective_percent"]) == ("config", 5) and "updated" not in out
    assert overrides(config) == {}
    code, _, err = run(config, "clear", "chat")  # nothing stood: still done
    assert code == 0 and "no decision stood" in err


def test_a_percent_stands_at_its_bounds(config: Path, run: Run) -> None:
    assert run(config, "set", "embed", "--percent", "100")[1]["effective_percent"] == 100
    assert run(config, "set", "chat", "--percent", "0")[1]["effective_percent"] == 0
    assert run(config, "set", "chat", "--percent", "2.5")[1]["effective_percent"] == 2.5
    code, out, err = run(config, "status", "chat")
    assert (code, out["effective_percent"], err) == (0, 2.5, ""), "embed's decision is no stray"
    assert {n: o.percent for n, o in overrides(config).items()} == {"chat": 2.5, "embed": 100}


def test_status_sums_the_replicas_that_published_in_the_last_30_s(config: Path, run: Run) -> None:
    publish(
        config, "replica-a", {"stable": ArmCounts(100, 2, 180.0), "canary": ArmCounts(6, 1, 420.0)}
    )
    publish(
        config, "replica-b", {"stable": ArmCounts(50, 0, 240.0), "canary": ArmCounts(4, 0, None)}
    )
    publish(config, "replica-c", {"stable": ArmCounts(7, 7, 9000.0)}, age_s=FRESH_S + 30)
    code, out, _ = run(config, "status", "chat")
    assert code == 0
    assert out["arms"] == {
        "stable": {"requests": 150, "failures": 2, "ttft_p95_ms": 240.0},
        "canary": {"requests": 10, "failures": 1, "ttft_p95_ms": 420.0},
    }
    assert run(config, "status", "embed")[1]["arms"]["canary"] == NO_TRAFFIC


@pytest.mark.parametrize(
    "argv",
    [
        ("status", "nope"),
        ("set", "nope", "--percent", "5"),
        ("rollback", "nope"),
        ("clear", "nope"),
    ],
)
def test_an_unknown_release_exits_1_and_changes_nothing(
    config: Path, run: Run, argv: tuple[str, ...]
) -> None:
    code, out, err = run(config, *argv)
    assert (code, out) == (1, None)
    assert err.count("\n") == 1 and "'nope' is not configured" in err
    assert "chat, embed" in err, "names the releases there are"
    assert overrides(config) == {}


@pytest.mark.parametrize("percent", ["-1", "100.5", "nan", "inf", "five", ""])
def test_a_percent_outside_0_to_100_exits_1_and_changes_nothing(
    config: Path, run: Run, percent: str
) -> None:
    code, out, err = run(config, "set", "chat", "--percent", percent)
    assert (code, out) == (1, None)
    assert err.count("\n") == 1 and "--percent must be a number within 0-100" in err
    assert overrides(config) == {}


def test_clear_removes_a_decision_the_config_no_longer_names(tmp_path: Path, run: Run) -> None:
    config = write(tmp_path)
    assert run(config, "rollback", "embed")[0] == 0
    doc = yaml.safe_load(config.read_text())
    doc["releases"] = [r for r in doc["releases"] if r["name"] != "embed"]
    config.write_text(yaml.safe_dump(doc))  # the release leaves the config
    code, out, err = run(config, "status")
    assert code == 0 and [s["name"] for s in out] == ["chat"]
    assert "a decision stands for release 'embed'" in err
    assert run(config, "clear", "embed")[:2] == (0, None)
    assert overrides(config) == {}
    assert run(config, "clear", "embed")[0] == 1, "now it is unknown"


def test_an_unreachable_store_exits_1_naming_state_unavailable(
    tmp_path: Path, run: Run, own_postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DSN_ENV, own_postgres.dsn)
    config = write(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV, "timeout_ms": 300})
    assert run(config, "set", "chat", "--percent", "10")[0] == 0  # migrated while it answers
    own_postgres.pause()
    try:
        for argv in (("status",), ("set", "chat", "--percent", "1"), ("rollback", "chat")):
            started = time.monotonic()
            code, out, err = run(config, *argv)
            assert (code, out) == (1, None), argv
            assert err.count("\n") == 1 and err.startswith("error: state_unavailable"), err
            assert own_postgres.password not in err and "127.0.0.1" not in err
            assert time.monotonic() - started < 5, "bounded by state.timeout_ms"
    finally:
        own_postgres.resume()
    code, out, _ = run(config, "status", "chat")
    assert code == 0 and out["state"] in ("override", "rolled_back")


def test_an_unset_dsn_env_exits_1_naming_the_variable(
    tmp_path: Path, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)
    config = write(tmp_path, {"backend": "postgres", "dsn_env": DSN_ENV})
    code, out, err = run(config, "status")
    assert (code, out) == (1, None)
    assert err.count("\n") == 1 and err.startswith("error: state_unavailable") and DSN_ENV in err


def test_an_unusable_sqlite_file_exits_1_without_its_path(tmp_path: Path, run: Run) -> None:
    config = write(tmp_path)
    (tmp_path / "var").write_text("a file where the state folder goes")
    code, out, err = run(config, "status")
    assert (code, out) == (1, None)
    assert err.count("\n") == 1 and err.startswith("error: state_unavailable")
    assert str(tmp_path) not in err
