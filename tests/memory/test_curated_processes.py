"""Real processes against one curated file: contention (8 writers) and crash safety
(a writer killed with SIGKILL at random moments, over and over)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from itertools import count
from pathlib import Path

import pytest

from mnemo.memory.curated import ENTRY_DELIMITER, MemoryFiles, parse_entries

pytestmark = pytest.mark.slow  # real processes: started first, with the longer timeout

# fork: the children start in milliseconds, which is what lets the crash loop do 200+
# kills quickly; each child only runs the functions below and exits.
MP = multiprocessing.get_context("fork")

# --- 8 processes x 100 adds --------------------------------------------------------------

PROCS, ADDS, LIMIT = 8, 100, 8000  # 800 entries of ~20 chars: roughly half fit


def _adder(memories: str, proc: int, out: str, go: multiprocessing.synchronize.Event) -> None:
    f = MemoryFiles(Path(memories), memory_limit=LIMIT, lock_timeout=60).shared()
    accepted, refused = [], []
    go.wait()
    for i in range(ADDS):
        entry = f"process {proc} add {i:03d}"
        result = f.add(entry)
        if result.success:
            accepted.append(entry)
        else:
            refused.append(result.message)
    Path(out).write_text(json.dumps({"accepted": accepted, "refused": refused}))


def test_eight_processes_adding_concurrently_lose_nothing(tmp_path: Path) -> None:
    memories = tmp_path / "memories"
    go = MP.Event()
    outs = [tmp_path / f"out{p}.json" for p in range(PROCS)]
    procs = [MP.Process(target=_adder, args=(str(memories), p, str(outs[p]), go)) for p in range(PROCS)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0  # no exception in any writer
    accepted: list[str] = []
    refusals: list[str] = []
    for out in outs:
        data = json.loads(out.read_text())
        accepted += data["accepted"]
        refusals += data["refused"]
    on_disk = MemoryFiles(memories, memory_limit=LIMIT).shared().load()
    assert sorted(on_disk.entries) == sorted(accepted)  # every accepted add is there, nothing else
    assert on_disk.chars <= LIMIT
    assert len(accepted) + len(refusals) == PROCS * ADDS
    assert accepted and refusals  # the limit was really contended
    assert all("would exceed its limit" in m for m in refusals)
    assert on_disk.chars > LIMIT - 30  # refusals only once the file was actually full


# --- kill -9 at random moments --------------------------------------------------------------

KILLS = 200


def _marker(entry: str) -> str:
    return entry.split()[1]  # "entry <17> ..." -> "<17>"


def _next_op(entries: tuple[str, ...], k: int) -> tuple[str, str | None, str | None]:
    """Op number ``k`` as (action, old_text, content): a pure function of the state and k,
    so the parent can compute every state the file may legally be in."""
    if len(entries) < 6 or k % 3 == 0:
        return "add", None, f"entry <{k}> {'x' * (k % 40)}".strip()
    if k % 3 == 1:
        return "replace", _marker(entries[0]), f"entry <{k}> replaced {'y' * (k % 30)}".strip()
    return "remove", _marker(entries[0]), None


def _apply(entries: tuple[str, ...], op: tuple[str, str | None, str | None]) -> tuple[str, ...]:
    action, _, content = op
    if action == "add":
        return (*entries, content or "")
    if action == "replace":
        return (content or "", *entries[1:])
    return entries[1:]


def _crash_writer(
    memories: str, start: int, entries: tuple[str, ...], log: str, ready: multiprocessing.synchronize.Event
) -> None:
    f = MemoryFiles(Path(memories)).shared()
    log_fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    ready.set()
    for k in count(start):
        op = _next_op(entries, k)
        os.write(log_fd, f"{k}\n".encode())  # the intent, logged before the write starts
        action, old, content = op
        if action == "add":
            result = f.add(content or "")
        elif action == "replace":
            result = f.replace(old or "", content or "")
        else:
            result = f.remove(old or "")
        if not result.success:
            os._exit(3)
        entries = _apply(entries, op)


def _last_logged(log: Path) -> int:
    lines = log.read_text().split("\n") if log.exists() else []
    complete = [line for line in lines[:-1] if line]  # the text after the last newline may be cut
    return int(complete[-1]) if complete else -1


def test_kill_9_at_random_moments_never_leaves_a_torn_file(tmp_path: Path) -> None:
    memories = tmp_path / "memories"
    path = memories / "MEMORY.md"
    log = tmp_path / "intent.log"
    rng = random.Random(20240229)
    states: list[tuple[str, ...]] = [()]  # states[k]: the entries before op k

    def state(k: int) -> tuple[str, ...]:
        while len(states) <= k:
            n = len(states) - 1
            states.append(_apply(states[n], _next_op(states[n], n)))
        return states[k]

    start, landed_before, landed_after = 0, 0, 0
    for _ in range(KILLS):
        ready = MP.Event()
        p = MP.Process(target=_crash_writer, args=(str(memories), start, state(start), str(log), ready))
        p.start()
        assert ready.wait(10)
        # Let the writer finish one or two ops first, however busy the machine: on a loaded
        # one a child that got no CPU before the kill made no progress at all.
        reached = start + rng.randint(1, 2)  # op `reached` logged: the ones before it are done
        deadline = time.monotonic() + 30
        while _last_logged(log) < reached and p.is_alive() and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 0.02))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        assert p.exitcode == -signal.SIGKILL  # it was still writing, never failed on its own

        text = path.read_bytes().decode("utf-8") if path.exists() else ""
        k = max(_last_logged(log), start - 1)  # the op that was in flight (or the last done)
        before, after = state(k), state(k + 1)
        if text == ENTRY_DELIMITER.join(before):
            landed_before += 1
            start = k
        else:
            assert text == ENTRY_DELIMITER.join(after), f"torn or unexpected file after op {k}: {text!r}"
            landed_after += 1
            start = k + 1
        assert parse_entries(text) == state(start)  # it parses, and every entry is whole
        # At most the one temp file of the killed write is left, and no other debris.
        temps = [n for n in os.listdir(memories) if n.endswith(".tmp")]
        assert len(temps) <= 1
        assert set(os.listdir(memories)) - set(temps) <= {"MEMORY.md", "MEMORY.md.lock"}

    # Kills landed both before and after a rename, i.e. at many points of the write.
    assert landed_before > 0 and landed_after > 0
    assert start > KILLS  # the writers made progress between kills
    # The lock is not left held by a dead writer: a new write goes through at once.
    f = MemoryFiles(memories, lock_timeout=1).shared()
    assert f.add("after the storm").success
    assert not [n for n in os.listdir(memories) if n.endswith(".tmp")]
