"""``mnemo skills rollback`` killed with SIGKILL at every step: the skill is afterwards
the version it had or the one restored — whole, never missing, never a mix of the two.

A real process runs one rollback and kills itself (``kill -9`` of its own pid) just
before its k-th file-system change — every rename, mkdir, unlink and rmdir, as Python's
audit hooks report them — for every k. Then a fresh store, as the next process would,
reads the skill.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mnemo.memory.scope import UserRef
from mnemo.memory.skills import SkillStore

pytestmark = pytest.mark.slow  # real processes: started first, with the longer timeout

NAME = "deploy-docs"
OLD = ("---\nname: deploy-docs\ndescription: Version one.\n---\n\nStep one.\n", "A1")
NEW = ("---\nname: deploy-docs\ndescription: Version two.\n---\n\nStep two.\n", "A2")
REF = "references/api.md"

_ROLLBACK = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from mnemo.memory.scope import UserRef
    from mnemo.memory.skills import SkillStore

    root, owner, kill_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    store = SkillStore(root)
    user = None if owner == "-" else UserRef.parse(owner)
    CHANGES = {"os.rename", "os.remove", "os.rmdir", "os.mkdir"}
    seen = 0

    def hook(event, args):
        global seen
        if event in CHANGES:
            seen += 1
            if seen == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    store.rollback("deploy-docs", user, to=1)
    print(seen, flush=True)
    """
)


def build(root: Path, owner: UserRef | None, *, deleted: bool) -> None:
    """Version 1 = OLD (in history), the current version = NEW (or deleted)."""
    store = SkillStore(root)
    store.create(OLD[0], owner, "ops" if owner is None else None, {REF: OLD[1]})
    store.edit(NAME, NEW[0], owner)
    store.write_file(NAME, REF, NEW[1], owner)
    if deleted:
        store.delete(NAME, owner)


def run(root: Path, owner: UserRef | None, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _ROLLBACK, str(root), str(owner) if owner else "-", str(kill_at)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def state(root: Path, owner: UserRef | None) -> tuple[str, str] | None:
    store = SkillStore(root)
    skill = store.find(NAME, owner)
    if skill is None:
        return None
    return store.read(skill), store.read(skill, REF)


@pytest.mark.parametrize(
    ("owner", "deleted"),
    [(None, False), (UserRef("telegram", "7"), False), (UserRef("telegram", "7"), True)],
    ids=["shared-in-category", "user", "user-deleted"],
)
def test_kill_9_at_every_step_of_a_rollback_leaves_the_old_or_the_restored_version(
    tmp_path: Path, owner: UserRef | None, deleted: bool
) -> None:
    template = tmp_path / "template"
    build(template, owner, deleted=deleted)
    before = None if deleted else NEW

    dry = tmp_path / "dry"
    shutil.copytree(template, dry, symlinks=True)
    done = run(dry, owner, 0)
    assert done.returncode == 0, done.stderr
    steps = int(done.stdout)
    assert steps >= 4, "the rollback changes the file system in several steps"
    assert state(dry, owner) == OLD

    outcomes = []
    for k in range(1, steps + 1):
        root = tmp_path / f"kill-{k}"
        shutil.copytree(template, root, symlinks=True)
        killed = run(root, owner, k)
        assert killed.returncode == -signal.SIGKILL, (k, killed.stderr)
        after = state(root, owner)
        assert after in (before, OLD), f"killed before change {k} of {steps}: {after!r}"
        outcomes.append(after)
        # Nothing of the rollback is left behind once a reader has looked, and the
        # store goes on working.
        assert not [p for p in root.rglob("*~*")], list(root.rglob("*~*"))
        store = SkillStore(root)
        assert store.history(NAME, owner)[:2] == [1, 2]
        store.rollback(NAME, owner, to=1)
        assert state(root, owner) == OLD
    # Early kills keep the old version, late ones the restored one: both are exercised.
    assert outcomes[0] == before and outcomes[-1] == OLD
