"""A real PostgreSQL server for tests: loopback only, no durability, stopped by PID.

:class:`PostgresServer` runs ``initdb`` in a temporary directory (superuser
``gateway`` with a random password, SCRAM over TCP, trust only on the
directory's own Unix socket) and starts ``postgres`` itself, so the PID it
holds is the postmaster's. Durability is off (``fsync``, ``synchronous_commit``,
``full_page_writes``): the data directory is thrown away at the end, and
``kill()`` is a process crash, not a machine's, so only the last commits
before it may be lost.
Readiness is a real password login, polled with a deadline instead of
sleeping. ``pause()``/``resume()`` stop and continue the postmaster and every
backend (an unreachable store: connects hang rather than fail), ``kill()``
is a crash, ``new_database()`` gives a test a database of its own. ``close()``
stops the server and removes the directory, so nothing is left behind.

``initdb`` and ``postgres`` refuse to run as root; as root every command runs
as the ``postgres`` OS user (the directory is chowned to it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from tests.support.redis import free_port, start_on_a_free_port

_START_DEADLINE_S = 30.0
_STOP_DEADLINE_S = 10.0
_INITDB_TIMEOUT_S = 60.0
_SIGNAL_DEADLINE_S = 2.0
_ADMIN_TIMEOUT_S = 10
USER = "gateway"
DATABASE = "gateway"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: settings for speed and isolation; none of them is what production runs
_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "200",
    "log_min_messages": "warning",
}


def database_name(hint: str) -> str:
    """A database name of its own: the hint (a test's name) made plain, plus random hex."""
    plain = re.sub(r"[^a-z0-9_]+", "_", hint.lower()).strip("_")[:40]
    return f"t_{plain}_{secrets.token_hex(4)}"


def server_bin() -> Path:
    """The newest major's ``bin`` of the Debian layout, else the one on PATH."""
    found: list[tuple[int, Path]] = []
    for postgres in Path("/usr/lib/postgresql").glob("*/bin/postgres"):
        major = postgres.parent.parent.name
        if major.isdigit() and (postgres.parent / "initdb").exists():
            found.append((int(major), postgres.parent))
    if found:
        return max(found)[1]
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("postgres") is not None:
        return Path(on_path).resolve().parent
    raise RuntimeError(
        "PostgreSQL's server binaries are missing: run `bash tests/support/ensure-postgresql.sh`"
    )


def _children(pid: int) -> list[int]:
    """Direct children of pid: /proc/<pid>/task/*/children, else every /proc/*/stat's ppid."""
    tasks = list(Path(f"/proc/{pid}/task").glob("*/children"))
    if tasks:
        kids: list[int] = []
        for task in tasks:
            with contextlib.suppress(OSError):
                kids += [int(p) for p in task.read_text().split()]
        return kids
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command in parentheses may hold spaces: ppid is the 2nd field after it
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(stat.parent.name))
    return kids


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _gone(pid: int) -> bool:
    """Exited (a zombie counts: it runs no more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _signal(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)  # by PID: processes this server started only


class PostgresServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gw-pg-"))
        self.data_dir = self.dir / "data"
        self.port = free_port()
        self.password = secrets.token_urlsafe(18)
        self._bin = server_bin()
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused: list[int] = []
        self._has_database = False
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            # initdb and postgres refuse root: everything runs as the postgres OS user.
            account = pwd.getpwnam("postgres")
            self._as = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            os.chown(self.dir, account.pw_uid, account.pw_gid)

    def dsn_for(self, database: str) -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    @property
    def dsn(self) -> str:
        return self.dsn_for(DATABASE)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _env(self) -> dict[str, str]:
        # No PG* variable of the caller's reaches the server's tools.
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "TZ": "UTC"}

    def _initdb(self) -> None:
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if self._as:
            os.chown(pwfile, self._as["user"], self._as["group"])
        argv = [
            str(self._bin / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",  # the socket is inside this 0700 directory
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        try:
            done = subprocess.run(
                argv,
                cwd=self.dir,
                env=self._env(),
                capture_output=True,
                timeout=_INITDB_TIMEOUT_S,
                check=False,
                **self._as,
            )
        finally:
            pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stderr.decode(errors='replace')[-2000:]}")

    def start(self) -> None:
        if self.running:
            return
        if not self.data_dir.exists():
            self._initdb()
        argv = [str(self._bin / "postgres"), "-D", str(self.data_dir), "-p", str(self.port)]
        settings = {**_SETTINGS, "unix_socket_directories": str(self.dir)}
        for name, value in settings.items():
            argv += ["-c", f"{name}={value}"]
        with (self.dir / "postgres.log").open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                cwd=self.dir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                **self._as,
            )
        self._wait_ready()
        if not self._has_database:
            self._create(DATABASE)
            self._has_database = True

    def _connect(self, database: str, timeout_s: int) -> psycopg.Connection[Any]:
        return psycopg.connect(
            self.dsn_for(database),
            connect_timeout=timeout_s,
            autocommit=True,
            options=f"-c statement_timeout={timeout_s * 1000}",
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_DEADLINE_S
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                break
            # A real login: SCRAM over TCP, as the code under test connects.
            try:
                self._connect("postgres", 2).close()
            except psycopg.OperationalError:
                time.sleep(0.02)
                continue
            return
        log = self.dir / "postgres.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        self.stop()
        raise RuntimeError(f"postgres did not accept a login on port {self.port}:\n{tail}")

    def _create(self, name: str) -> None:
        if not _NAME.match(name):
            raise ValueError(f"not a plain database name: {name!r}")
        with self._connect("postgres", _ADMIN_TIMEOUT_S) as conn:
            # template0: nobody connects to it, so creations never collide there.
            statement = sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0")
            conn.execute(statement.format(sql.Identifier(name), sql.Identifier(USER)))

    def new_database(self, name: str) -> str:
        """A fresh, empty database owned by ``gateway``; its DSN."""
        self._create(name)
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Drop it, ending its sessions (a test may leave connections behind)."""
        with self._connect("postgres", _ADMIN_TIMEOUT_S) as conn:
            statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(statement.format(sql.Identifier(name)))

    def pause(self) -> None:
        """SIGSTOP the postmaster, then every backend: the server is there and answers nothing."""
        if self._proc is None or self._paused:
            return
        # The postmaster first, so it forks no backend past the scan.
        _signal([self._proc.pid], signal.SIGSTOP)
        self._paused = [self._proc.pid]
        deadline = time.monotonic() + _SIGNAL_DEADLINE_S
        while time.monotonic() < deadline:
            fresh = [p for p in _descendants(self._proc.pid) if p not in self._paused]
            if not fresh:
                return
            _signal(fresh, signal.SIGSTOP)
            self._paused += fresh

    def resume(self) -> None:
        """SIGCONT what pause() stopped, the backends before the postmaster."""
        paused, self._paused = self._paused, []
        _signal(paused[::-1], signal.SIGCONT)

    def kill(self) -> None:
        """A crash: SIGKILL the postmaster and every backend, and wait until they are gone."""
        proc, self._proc = self._proc, None
        self._paused = []
        if proc is None:
            return
        tree = [proc.pid, *_descendants(proc.pid)]
        _signal(tree, signal.SIGKILL)
        proc.wait(_STOP_DEADLINE_S)
        deadline = time.monotonic() + _STOP_DEADLINE_S
        while not all(_gone(pid) for pid in tree):
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres processes outlived SIGKILL: {tree}")
            time.sleep(0.01)

    def stop(self) -> None:
        """A fast shutdown, SIGKILL past the deadline.

        SIGINT, not SIGTERM: to the postmaster SIGTERM is a *smart* shutdown,
        which waits for every session to end (a pool a test left open would
        hold it until the deadline); SIGINT ends them and checkpoints."""
        if self._paused:
            self.resume()  # a stopped postmaster would not act on the signal
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is not None:
            self._proc = None
            return
        proc.send_signal(signal.SIGINT)  # by PID: the postmaster this object started
        try:
            proc.wait(_STOP_DEADLINE_S)
            self._proc = None
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: SIGQUIT, the postmaster ends every
        backend at once, mid-transaction or mid-COMMIT, without a checkpoint;
        then the server starts again on the same port (crash recovery)."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("the server is not running")
        if self._paused:
            self.resume()
        proc.send_signal(signal.SIGQUIT)  # by PID: the postmaster this object started
        try:
            proc.wait(_STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._proc = None
        self.start()

    def _remove_shared_memory(self) -> None:
        """After a kill the SysV segment named in postmaster.pid outlives the directory."""
        pidfile = self.data_dir / "postmaster.pid"
        ipcrm = shutil.which("ipcrm")
        if ipcrm is None or not pidfile.exists():
            return
        lines = pidfile.read_text(errors="replace").splitlines()
        ids = lines[6].split() if len(lines) > 6 else []
        if len(ids) == 2 and ids[1].isdigit():
            subprocess.run(
                [ipcrm, "-m", ids[1]], capture_output=True, timeout=_SIGNAL_DEADLINE_S, check=False
            )

    def close(self) -> None:
        self.stop()
        self._remove_shared_memory()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A started server with database ``gateway``; a port taken between probing
    and binding gets a new one (3 tries)."""
    server = PostgresServer()
    try:
        start_on_a_free_port(server)
        yield server
    finally:
        server.close()
