"""Footprint of one idle ``mnemo run``: resident memory, and the time from exec to ready.
Prints figures; asserts nothing.

    python bench/footprint.py [--backend sqlite|postgresql|both] [--runs 3] [--idle-s 5]

Each run starts ``python -m mnemo run`` as a real process on a fresh profile (the web
chat on a free 127.0.0.1 port, no platform token, no API key: the local trial mode, so
nothing leaves the machine), polls ``/healthz`` until it answers 200 — "ready" — then
lets it idle for ``--idle-s`` seconds and reads its resident set (``VmRSS``) and peak
(``VmHWM``) from ``/proc``, and stops it with SIGTERM. It is then started a second time
on the same profile (a restart: the schema is already there). PostgreSQL runs use a
throw-away cluster (``tests/support/pgcluster.py``), a fresh database per run.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def one_start(home: Path, url: str | None, idle_s: float) -> tuple[float, float, float]:
    """(seconds to ready, RSS MiB after idling, peak RSS MiB)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))}
    env.update(MNEMO_HOME=str(home), MNEMO_WEB_PORT=str(port), MNEMO_LOG_LEVEL="warning")
    if url is not None:
        env["MNEMO_DATABASE_URL"] = url
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "mnemo", "run"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"mnemo run exited {proc.returncode}: {proc.stderr.read().decode()[-400:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet
            if time.perf_counter() - t0 > 60:
                raise RuntimeError("mnemo run was not ready within 60 s")
            time.sleep(0.01)
        ready = time.perf_counter() - t0
        time.sleep(idle_s)
        rss, peak = proc_kib(proc.pid, "VmRSS") / 1024, proc_kib(proc.pid, "VmHWM") / 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    return ready, rss, peak


def run(backend: str, runs: int, idle_s: float) -> None:
    if backend == "postgresql":
        from tests.support.pgcluster import running_cluster

        cluster_cm = running_cluster()
    else:
        cluster_cm = nullcontext(None)
    first, again, rss, peak = [], [], [], []
    with cluster_cm as cluster:
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="mnemo-footprint-") as tmp:
                home = Path(tmp) / "home"
                home.mkdir(mode=0o700)
                url = cluster.fresh_database() if cluster is not None else None
                r1, m1, p1 = one_start(home, url, idle_s)
                r2, m2, p2 = one_start(home, url, idle_s)
                first.append(r1)
                again.append(r2)
                rss += [m1, m2]
                peak += [p1, p2]
    med = statistics.median
    print(f"{backend:>10}: ready in {med(first):.2f} s (fresh profile), {med(again):.2f} s (restart); "
          f"idle RSS {med(rss):.0f} MiB (min {min(rss):.0f}, max {max(rss):.0f}), peak {med(peak):.0f} MiB "
          f"— median of {runs} runs", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=5.0)
    args = ap.parse_args()
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        run(backend, args.runs, args.idle_s)


if __name__ == "__main__":
    main()
