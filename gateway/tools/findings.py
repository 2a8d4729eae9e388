"""What ``check`` reports: one :class:`Finding` per problem, naming its config key.

A finding never carries a file's contents or a secret's value: problems are
fixed phrases and exception *type* names (``preflight.py`` says what is
checked; ``preflight_agents.py`` the agents' part).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = ["Finding", "Level", "error", "read_bounded", "warning"]

Level = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    #: the config key, dotted (``listen.tls.keyfile``, ``api_keys[0].sha256``)
    key: str
    #: a fixed phrase; never file contents or a secret
    problem: str
    #: the file the finding is about, when there is one
    path: Path | None = None

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path is not None else ""
        return f"{self.key}: {where}{self.problem}"


def error(key: str, problem: str, path: Path | None = None) -> Finding:
    return Finding("error", key, problem, path)


def warning(key: str, problem: str, path: Path | None = None) -> Finding:
    return Finding("warning", key, problem, path)


def read_bounded(
    key: str, path: Path, limit: int, limit_name: str | None = None
) -> tuple[bytes | None, Finding | None]:
    """The file's bytes, or the finding; ``limit_name`` names a configured limit."""
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        return None, error(key, f"cannot read ({type(exc).__name__})", path)
    if len(data) > limit:
        return None, error(key, f"larger than {limit_name or f'{limit} bytes'}", path)
    return data, None
