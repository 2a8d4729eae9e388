"""The PostgreSQL schema, created and migrated by the gateway itself (spec §17).

Versioned steps, applied in order inside one transaction that holds a
transaction-level advisory lock: replicas starting at once take turns, and
each finds the version the one before it left. Every step is plain DDL; a
new step is appended, never edited.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

#: any constant both old and new replicas agree on (the lock's key)
_LOCK_KEY = 0x6D72_6777_7374  # "mrgwst"

STEPS: tuple[str, ...] = (
    # 1: evidence records and leases, kept responses
    """
    CREATE TABLE evidence_records (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        media_type TEXT NOT NULL,
        ext TEXT NOT NULL,
        bytes BIGINT NOT NULL,
        locator_sha256 TEXT,
        created BIGINT NOT NULL,
        seq BIGSERIAL NOT NULL
    );
    CREATE INDEX evidence_records_sha256 ON evidence_records (sha256);
    CREATE INDEX evidence_records_tenant ON evidence_records (tenant, created, seq);
    CREATE TABLE evidence_leases (
        request_id TEXT NOT NULL,
        evidence_id TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        ext TEXT NOT NULL,
        replica TEXT NOT NULL,
        expires DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (request_id, evidence_id)
    );
    CREATE INDEX evidence_leases_sha256 ON evidence_leases (sha256);
    CREATE INDEX evidence_leases_expires ON evidence_leases (expires);
    CREATE TABLE kept_responses (
        tenant TEXT NOT NULL,
        id TEXT NOT NULL,
        alias TEXT NOT NULL,
        created DOUBLE PRECISION NOT NULL,
        expires BIGINT NOT NULL,
        previous_id TEXT,
        input_items BYTEA NOT NULL,
        output_items BYTEA NOT NULL,
        body BYTEA,
        upstream_id TEXT,
        size BIGINT NOT NULL,
        PRIMARY KEY (tenant, id)
    );
    CREATE INDEX kept_responses_age ON kept_responses (tenant, created);
    CREATE INDEX kept_responses_expires ON kept_responses (expires);
    """,
    # 2: release decisions and the arms' figures each replica publishes (spec §18)
    """
    CREATE TABLE release_decisions (
        name TEXT PRIMARY KEY,
        state TEXT NOT NULL CHECK (state IN ('override', 'rolled_back')),
        percent DOUBLE PRECISION NOT NULL CHECK (percent >= 0 AND percent <= 100),
        updated DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE release_figures (
        name TEXT NOT NULL,
        replica TEXT NOT NULL,
        arm TEXT NOT NULL,
        requests BIGINT NOT NULL,
        failures BIGINT NOT NULL,
        ttft_p95_ms DOUBLE PRECISION,
        updated DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (name, replica, arm)
    );
    """,
    # 3: what each tenant keeps, counted as it changes: a keep checks its
    # tenant's bound in O(1) instead of summing every row it keeps
    """
    CREATE TABLE kept_usage (
        tenant TEXT PRIMARY KEY,
        bytes BIGINT NOT NULL
    );
    INSERT INTO kept_usage (tenant, bytes)
        SELECT tenant, sum(size) FROM kept_responses GROUP BY tenant;
    """,
    # 4: each replica's receipt-chain head, recorded every audit.anchor_interval_s (spec §24)
    """
    CREATE TABLE receipt_anchors (
        replica TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
        sha256 TEXT NOT NULL,
        updated DOUBLE PRECISION NOT NULL
    );
    """,
)


async def migrate(
    conn: asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record],
) -> int:
    """Bring the schema to the newest version; the version found before."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute("CREATE TABLE IF NOT EXISTS gateway_schema (version INTEGER NOT NULL)")
        found = await conn.fetchval("SELECT max(version) FROM gateway_schema")
        version = int(found or 0)
        if version > len(STEPS):
            # A newer gateway migrated this store: refuse to guess at its schema.
            raise asyncpg.InterfaceError(
                f"the state schema is version {version}; this gateway knows {len(STEPS)}"
            )
        for number in range(version + 1, len(STEPS) + 1):
            await conn.execute(STEPS[number - 1])
            await conn.execute("INSERT INTO gateway_schema (version) VALUES ($1)", number)
        return version
