"""Where what callers create lives (spec §17): :class:`StateConfig`.

``sqlite`` keeps the evidence catalog and the kept responses beside
``staging.dir`` for one replica; ``postgres`` shares them with every replica
(the DSN comes from an environment variable, never from the file: it holds a
password).
"""

from __future__ import annotations

import os
import socket
from typing import Annotated, Literal

from pydantic import Field

from gateway.config.base import Model


class StateConfig(Model):
    """Evidence records, leases and kept responses (spec §17)."""

    backend: Literal["sqlite", "postgres"] = Field(
        "sqlite",
        description="sqlite: beside staging.dir, one replica; postgres: shared by all replicas.",
    )
    dsn_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        "GATEWAY_STATE_DSN",
        description="postgres: environment variable holding the DSN (postgresql://…).",
    )
    timeout_ms: Annotated[int, Field(ge=1, le=60_000)] = Field(
        1000, description="Bound of each state call; past it the request gets state_unavailable."
    )
    replica_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$")] | None = Field(
        None,
        description="Names this replica's leases and receipts (default <hostname>-<pid>).",
    )

    @property
    def replica(self) -> str:
        """This process's replica id: the configured one, else ``<hostname>-<pid>``."""
        if self.replica_id is not None:
            return self.replica_id
        host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "._-")[:48]
        return f"{host or 'replica'}-{os.getpid()}"

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000
