"""A real PostgreSQL server on loopback for integration tests (Debian's `postgresql` package).

`initdb` makes a fresh cluster in a temporary folder and `postgres` serves it on a free
127.0.0.1 port with password (scram-sha-256) authentication over TCP, as a production database
is reached. PostgreSQL refuses to run as root, so under root (CI, containers) the cluster belongs
to the `postgres` user the Debian package creates (or `nobody`). Durability is off (fsync,
synchronous commit): this is a test server. Teardown stops only the process started here.

    with postgres_server() as pg:
        pg.url  # postgresql://dagster:...@127.0.0.1:PORT/dagster
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.seaweed import free_ports, log_tail

READY_TIMEOUT_S = 60.0
USER = "dagster"
PASSWORD = "dagster-test-password"
DATABASE = "dagster"
INSTALL_HINT = "apt-get install postgresql (.ci/run installs it)"


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    password: str
    database: str
    log_path: Path

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{self.database}"

    def env(self) -> dict[str, str]:
        """The variables deploy/dagster.yaml reads (orchestration.instance.POSTGRES_ENV)."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.database,
        }

    def connect(self, database: str | None = None):
        import psycopg2

        return psycopg2.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                                dbname=database or self.database, connect_timeout=3)


def find_bindir() -> Path | None:
    """The folder holding `initdb` and `postgres`: PATH first, then Debian's versioned folders."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    for initdb in reversed(candidates):
        folder = Path(initdb).parent
        if (folder / "postgres").is_file():
            return folder
    return None


def _server_account() -> pwd.struct_passwd | None:
    """None when not root (the server runs as us); else the account the cluster will belong to."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    pytest.skip("running as root and neither a `postgres` nor a `nobody` account exists to own the cluster")


def _run_as(account: pwd.struct_passwd | None) -> dict:
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _initdb(bindir: Path, work: Path, data: Path, account, log) -> None:
    password_file = work / "pw"
    password_file.write_text(PASSWORD)
    if account is not None:
        for path in (work, password_file):
            os.chown(path, account.pw_uid, account.pw_gid)
    subprocess.run(
        [str(bindir / "initdb"), "-D", str(data), "-U", USER, f"--pwfile={password_file}", "--auth-local=trust",
         "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync"],
        check=True, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work, timeout=120,
        env={"PATH": os.environ.get("PATH", ""), "LANG": "C"}, **_run_as(account),
    )
    password_file.unlink()


def _launch(bindir: Path, work: Path, data: Path, port: int, account, log) -> subprocess.Popen:
    settings = {
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        "unix_socket_directories": str(work),  # not /var/run/postgresql: that needs the Debian service
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "200",  # daemon threads, the code server, run workers and the test
        "shared_buffers": "64MB",
    }
    command = [str(bindir / "postgres"), "-D", str(data)] + [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work,
                            env={"PATH": os.environ.get("PATH", ""), "LANG": "C"}, start_new_session=True, **_run_as(account))


def _wait_ready(process: subprocess.Popen, server: Postgres) -> str | None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return f"postgres exited with code {process.returncode}"
        try:
            server.connect("postgres").close()
            return None
        except Exception as error:  # not accepting connections yet
            last = str(error).strip()
        time.sleep(0.2)
    return f"not accepting connections after {READY_TIMEOUT_S:.0f}s ({last})"


def _create_database(server: Postgres) -> None:
    connection = server.connect("postgres")
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{server.database}"')
    finally:
        connection.close()


def _stop(process: subprocess.Popen) -> None:
    """SIGINT is PostgreSQL's fast shutdown; SIGKILL if it lingers."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            process.send_signal(sig)
            process.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A fresh cluster with an empty `dagster` database; skips when the server binaries are absent."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 is not installed (pip install 'searchsmith[deploy]')")
    bindir = find_bindir()
    if bindir is None:
        pytest.skip(f"PostgreSQL server binaries (initdb, postgres) not found on PATH or under /usr/lib/postgresql: {INSTALL_HINT}")
    account = _server_account()
    work = Path(tempfile.mkdtemp(prefix="pg-"))  # short: the unix socket path has a 108-byte limit
    data = work / "data"
    (port,) = free_ports(1)
    server = Postgres("127.0.0.1", port, USER, PASSWORD, DATABASE, work / "postgres.log")
    process = None
    try:
        with open(server.log_path, "wb") as log:
            if account is not None:
                os.chown(work, account.pw_uid, account.pw_gid)
            _initdb(bindir, work, data, account, log)
            process = _launch(bindir, work, data, port, account, log)
        problem = _wait_ready(process, server)
        if problem is not None:
            pytest.fail(f"PostgreSQL did not start: {problem}; log tail:\n{log_tail(server.log_path)}")
        _create_database(server)
        yield server
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)
