"""Shared pytest setup. Real servers come from tests/support/stack.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.testing.harness import DEMO_SECRET_ENV
from tests.support.jwt import HS_SECRET
from tests.support.postgres import PostgresServer, database_name, postgres_server
from tests.support.redis import RedisServer, redis_server
from tests.support.stack import Stack, running_stack


@pytest.fixture(autouse=True)
def _dev_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DEMO_SECRET_ENV, HS_SECRET)


@pytest.fixture
def stack(tmp_path: Path, _dev_secret: None) -> Iterator[Stack]:
    with running_stack(tmp_path) as running:
        yield running


@pytest.fixture(scope="session")
def shared_redis() -> Iterator[RedisServer]:
    """One real redis-server for the session (loopback, no persistence)."""
    with redis_server() as server:
        yield server


@pytest.fixture
def redis_url(shared_redis: RedisServer) -> str:
    """The session's server, emptied for this test."""
    with shared_redis.client() as client:
        client.flushall()
    return shared_redis.url


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server of this test's own, to stop, pause and restart."""
    with redis_server() as server:
        yield server


@pytest.fixture(scope="session")
def shared_postgres() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (loopback, no durability)."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def postgres_dsn(shared_postgres: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database of this test's own on the session's server: its DSN.
    Dropped afterwards (sessions the test left open are ended)."""
    name = database_name(request.node.name)
    yield shared_postgres.new_database(name)
    shared_postgres.drop_database(name)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, to pause, kill and start again."""
    with postgres_server() as server:
        yield server
