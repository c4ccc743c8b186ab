"""A throw-away PostgreSQL cluster for the test session: ``initdb`` in a temp folder, the
server listening only on a Unix socket in that folder (no TCP port), ``pg_ctl stop`` at
the end. Each test gets a fresh database (``fresh_database``), dropped after the test.

Under pytest-xdist every worker is a session: each has its own cluster, folder and
socket, so workers share nothing. The folder is in RAM (``/dev/shm``) when there is room:
a database is ~8 MB of files, created in ~50 ms there against ~300 ms on a busy disk.

The binaries come from Debian's packages (``/usr/lib/postgresql/<version>/bin``, which
``tests/run.sh`` installs when missing) or ``$PATH``. PostgreSQL refuses to run as root:
as root, the cluster runs as the ``postgres`` user the Debian package creates.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_numbers = itertools.count()
RAM_DIR = Path("/dev/shm")
RAM_NEEDED = 1 << 30  # bytes free in RAM_DIR to put a cluster there (it stays far smaller)
_running: list[Cluster] = []  # this session's cluster, once a test asked for it


def find_bindir() -> Path | None:
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    for d in candidates:
        if (Path(d) / "initdb").exists():
            return Path(d)
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


class Cluster:
    def __init__(self, root: Path, bindir: Path, user: str | None) -> None:
        self.root = root
        self.bindir = bindir
        self.user = user  # run the server as this OS user (None: as ourselves)
        self.data = root / "data"
        self.socket_dir = root
        self.created: list[str] = []  # databases of the running test, dropped after it

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:1])} failed: {done.stdout}\n{done.stderr}")

    def start(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "mnemo",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )
        options = (
            f"-k {self.socket_dir} -c listen_addresses='' -c fsync=off -c"
            " synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start"
        )

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://mnemo@/{dbname}?host={self.socket_dir}"

    def fresh_database(self) -> str:
        """A new, empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(_numbers)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.created.append(name)
        return self.url(name)

    def drop_created(self) -> None:
        """Drop the databases ``fresh_database`` made; FORCE ends the sessions a test left
        behind (a replica killed with SIGKILL, a pool still closing)."""
        import psycopg

        names, self.created = self.created, []
        if names:
            with psycopg.connect(self.url(), autocommit=True) as conn:
                for name in names:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cluster_parent() -> str | None:
    """RAM when it has room, else the usual temp folder (None)."""
    try:
        free = os.statvfs(RAM_DIR)
    except OSError:
        return None
    roomy = free.f_bavail * free.f_frsize >= RAM_NEEDED
    return str(RAM_DIR) if roomy and os.access(RAM_DIR, os.W_OK) else None


@contextmanager
def running_cluster() -> Iterator[Cluster]:
    bindir = find_bindir()
    if bindir is None:
        pytest.fail(
            "PostgreSQL binaries not found (initdb): install Debian's postgresql package "
            "(tests/run.sh does as root), the contract suite runs on both backends"
        )
    user = "postgres" if os.geteuid() == 0 else None
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.fail("running as root needs the 'postgres' user (Debian's postgresql package creates it)")
    root = Path(tempfile.mkdtemp(prefix="mnemo-pg-", dir=cluster_parent()))
    if user is not None:
        shutil.chown(root, user)
    cluster = Cluster(root, bindir, user)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    with running_cluster() as cluster:
        _running.append(cluster)
        try:
            yield cluster
        finally:
            _running.remove(cluster)


@pytest.fixture(autouse=True)
def _drop_test_databases() -> Iterator[None]:
    """After each test (and its own fixtures: autouse ones are torn down last), drop the
    databases it made, so the cluster holds only the running test's."""
    yield
    for cluster in _running:
        cluster.drop_created()
