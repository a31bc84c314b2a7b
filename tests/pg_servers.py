"""A throw-away PostgreSQL cluster for tests and the soak that stop, crash or restart the database.

The cluster is made with ``initdb`` and run with ``pg_ctl`` in a temporary directory, on a free
port, as the ``postgres`` operating-system user when started by root (``initdb`` refuses root).
``fsync`` and ``full_page_writes`` are off (the machine never crashes, only the server does, so
the operating system keeps every write); ``synchronous_commit`` stays on, so a commit the server
acknowledged survives an ``immediate`` stop, as on a real server. The machine's own PostgreSQL is
never touched.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.redis_servers import free_port

BINARIES = Path("/usr/lib/postgresql")
SETTINGS = {
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "32MB",
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "log_min_messages": "warning",
}


def _bin(name: str) -> str:
    """``initdb``/``pg_ctl`` of the newest installed server, else whatever is on PATH."""
    versions = sorted(BINARIES.glob("*/bin"), key=lambda path: int(path.parent.name)
                      if path.parent.name.isdigit() else 0)
    for directory in reversed(versions):
        if (directory / name).exists():
            return str(directory / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed (Debian's postgresql package provides it)")
    return found


class PostgresServer:
    """One cluster: ``start()`` (``initdb`` on the first call), ``stop()``, ``restart()``, ``close()``."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.port = free_port()
        self.workdir = Path(tempfile.mkdtemp(prefix=f"pg-{self.port}-", dir=workdir))
        self.data = self.workdir / "data"
        self.log = self.workdir / "server.log"
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self.workdir, entry.pw_uid, entry.pw_gid)
        self.workdir.chmod(0o755)

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database,
                               autocommit=True, connect_timeout=5)

    def start(self, timeout: float = 60) -> PostgresServer:
        if not (self.data / "PG_VERSION").exists():
            self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync")
            with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
                conf.write(f"\nport = {self.port}\n")
                conf.writelines(f"{key} = {value}\n" for key, value in SETTINGS.items())
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", str(int(timeout)),
                  "start", timeout=timeout + 10)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect() as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL on port {self.port} did not start:\n{self.log_tail()}") from None
                time.sleep(0.1)

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def stop(self, mode: str = "fast") -> None:
        """``fast``: a clean shutdown that ends every session; ``immediate``: a crash (recovery on start)."""
        if self.running():
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast", down_for: float = 0.0) -> None:
        self.stop(mode)
        if down_for > 0:
            time.sleep(down_for)
        self.start()

    def create_database(self, name: str) -> None:
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')

    def backends(self, database: str) -> list[int]:
        """Client backends connected to ``database`` (this call's own excluded)."""
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()", (database,)).fetchall()
        return [int(str(row[0])) for row in rows]

    def terminate_backends(self, database: str, *, exclude_own: bool = True, pids: list[int] | None = None) -> int:
        """``pg_terminate_backend`` on the sessions of ``database`` (or only ``pids``); returns how many ended.
        The connection issuing it is never among them (``exclude_own`` is kept for readability)."""
        targets = self.backends(database) if pids is None else pids
        if not targets:
            return 0
        with self.connect() as conn:
            rows = conn.execute("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest(%s::int[]) pid",
                                (targets,)).fetchone()
        return int(str(rows[0])) if rows else 0

    def dump(self, database: str, target: Path) -> None:
        """``pg_dump`` of ``database`` into ``target`` (custom format, for ``pg_restore``)."""
        result = subprocess.run([_bin("pg_dump"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-Fc",
                                 "-f", str(target), database], capture_output=True, text=True, timeout=600, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"pg_dump of {database} failed ({result.returncode}): {result.stderr}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-chars:] if self.log.exists() else ""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
