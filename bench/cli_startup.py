"""CLI start-up: how long the everyday commands take, next to importing the LLM SDK.

    python bench/cli_startup.py [--runs 10] [--json]

Each command runs as a fresh process (``python -m mnemo …``) with ``MNEMO_HOME`` set to
a throw-away profile; the figure is the median wall time of ``--runs`` runs, after one
untimed warm-up run of each (which also creates ``state.db``). ``python -c pass`` is the
interpreter's own floor; ``import anthropic`` is what every command used to pay before
the CLI imported heavy libraries only in the handlers that use them.

Target: ``mnemo --help`` takes less than half as long as ``import anthropic``.
``--json`` adds one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_RATIO = 0.5


def commands() -> list[tuple[str, list[str]]]:
    py = sys.executable
    return [
        ("python -c pass", [py, "-c", "pass"]),
        ("python -c 'import anthropic'", [py, "-c", "import anthropic"]),
        ("mnemo --help", [py, "-m", "mnemo", "--help"]),
        ("mnemo memory show", [py, "-m", "mnemo", "memory", "show"]),
        ("mnemo sessions search x", [py, "-m", "mnemo", "sessions", "search", "x"]),
        ("mnemo cron list", [py, "-m", "mnemo", "cron", "list"]),
    ]


def wall_time(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited with {proc.returncode}:\n{proc.stderr}")
    return elapsed


def measure(runs: int, home: Path) -> dict[str, dict[str, float]]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_"))
    }
    env["MNEMO_HOME"] = str(home)
    cases = commands()
    for _, argv in cases:  # warm-up: file cache, .pyc files, state.db
        wall_time(argv, env)
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(runs):  # interleaved, so a noisy moment spreads over every command
        for name, argv in cases:
            times[name].append(wall_time(argv, env))
    return {
        name: {
            "median_ms": round(statistics.median(t) * 1000, 1),
            "min_ms": round(min(t) * 1000, 1),
            "max_ms": round(max(t) * 1000, 1),
        }
        for name, t in times.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="timed runs of each command (default 10)")
    ap.add_argument("--json", action="store_true", help="also print the figures as one JSON line at the end")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="mnemo-cli-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        results = measure(args.runs, home)
    width = max(len(name) for name in results)
    print(f"{'command':<{width}}  {'median':>9}  {'min':>9}  {'max':>9}   ({args.runs} runs each)")
    for name, r in results.items():
        print(f"{name:<{width}}  {r['median_ms']:7.1f}ms  {r['min_ms']:7.1f}ms  {r['max_ms']:7.1f}ms")
    ratio = results["mnemo --help"]["median_ms"] / results["python -c 'import anthropic'"]["median_ms"]
    verdict = "meets" if ratio < TARGET_RATIO else "misses"
    print(f"mnemo --help / import anthropic = {ratio:.2f} ({verdict} the target < {TARGET_RATIO})")
    if args.json:
        print(
            json.dumps(
                {
                    "runs": args.runs,
                    "results": results,
                    "help_vs_anthropic": round(ratio, 3),
                    "target": TARGET_RATIO,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
