"""``mnemo skills install`` of a ``.zip`` or ``.tar.gz`` (issue 26 item 5): a bomb — a
small archive inflating to 100 MB — is refused with one line before it fills the disk
or the memory, nothing is installed, and the process's peak memory stays within a few
megabytes of installing a small skill (measured in a subprocess: its ``ru_maxrss``).
Too many entries, or files that together exceed the limit, are refused the same way."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from mnemo.memory.skills.archive import MAX_ENTRIES, MAX_FILE_BYTES, MAX_TOTAL_BYTES

SKILL = "---\nname: bomb\ndescription: A skill carrying a bomb.\n---\n\n# bomb\n\nNothing to see.\n"
BOMB_BYTES = 100 * 1024**2
# Peak RSS (KiB) a bomb may add over installing a small skill: a read buffer, not the bomb.
ALLOWED_EXTRA_KIB = 10 * 1024
PROBE = (
    "import resource, sys\n"
    "from mnemo.cli.main import main\n"
    "code = main(sys.argv[1:])\n"
    "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, code)\n"
)


class Filler(io.RawIOBase):
    """``size`` bytes of one letter, produced as they are read (never held at once)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]  # RawIOBase's buffer type
        n = min(len(buffer), self.left)
        buffer[:n] = b"a" * n
        self.left -= n
        return n


def zip_bomb(path: Path, size: int = BOMB_BYTES) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("bomb/SKILL.md", SKILL)
        with zf.open("bomb/references/big.txt", "w", force_zip64=True) as out:
            filler = Filler(size)
            while chunk := filler.read(1 << 20):
                out.write(chunk)
    return path


def tar_bomb(path: Path, size: int = BOMB_BYTES) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        info = tarfile.TarInfo("bomb/SKILL.md")
        info.size = len(SKILL)
        tf.addfile(info, io.BytesIO(SKILL.encode()))
        info = tarfile.TarInfo("bomb/references/big.txt")
        info.size = size
        tf.addfile(info, io.BufferedReader(Filler(size)))
    return path


def install(home: Path, archive: Path) -> tuple[int, str, int]:
    """``mnemo skills install`` in a process of its own: exit code, stderr, peak RSS (KiB)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, "--home", str(home), "skills", "install", str(archive)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    peak = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")]
    assert peak, done.stderr
    _, rss, code = peak[-1].split()
    return int(code), done.stderr, int(rss)


@pytest.mark.parametrize("build", [zip_bomb, tar_bomb], ids=["zip", "tar.gz"])
def test_a_bomb_is_refused_in_one_line_with_nothing_installed_and_memory_bounded(
    tmp_path: Path, build: object
) -> None:
    small = tmp_path / "small.zip"
    with zipfile.ZipFile(small, "w") as zf:
        zf.writestr("fine/SKILL.md", SKILL.replace("bomb", "fine"))
        zf.writestr("fine/references/notes.md", "a few notes\n")
    code, err, baseline = install(tmp_path / "home-small", small)
    assert code == 0, err

    bomb = build(tmp_path / ("bomb.zip" if build is zip_bomb else "bomb.tar.gz"))  # type: ignore[operator]  # one of the two builders
    assert bomb.stat().st_size < 1024**2, "a small archive"
    home = tmp_path / "home"
    code, err, peak = install(home, bomb)
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("mnemo: ")]
    assert len(lines) == 1 and "references/big.txt" in lines[0] and "nothing was installed" in lines[0], err
    assert "Traceback" not in err
    assert not (home / "skills").exists() or not any((home / "skills").rglob("SKILL.md"))
    assert peak - baseline < ALLOWED_EXTRA_KIB, f"peak {peak} KiB vs {baseline} KiB for a small skill"


def test_too_many_entries_and_too_much_in_all_are_refused(tmp_path: Path) -> None:
    from mnemo.cli.main import main

    many = tmp_path / "many.zip"
    with zipfile.ZipFile(many, "w") as zf:
        zf.writestr("s/SKILL.md", SKILL)
        for i in range(MAX_ENTRIES):
            zf.writestr(f"s/references/{i}.md", "x\n")
    assert main(["--home", str(tmp_path / "a"), "skills", "install", str(many)]) == 1

    heavy = tmp_path / "heavy.tar.gz"
    with tarfile.open(heavy, "w:gz") as tf:
        info = tarfile.TarInfo("s/SKILL.md")
        info.size = len(SKILL)
        tf.addfile(info, io.BytesIO(SKILL.encode()))
        for i in range(MAX_TOTAL_BYTES // MAX_FILE_BYTES + 1):
            info = tarfile.TarInfo(f"s/references/{i}.md")
            info.size = MAX_FILE_BYTES
            tf.addfile(info, io.BufferedReader(Filler(MAX_FILE_BYTES)))
    assert main(["--home", str(tmp_path / "b"), "skills", "install", str(heavy)]) == 1
    assert not (tmp_path / "a" / "skills").exists() and not (tmp_path / "b" / "skills").exists()


def test_a_skill_within_the_limits_installs_from_either_kind_of_archive(tmp_path: Path) -> None:
    from mnemo.cli.main import main

    tgz = tmp_path / "s.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        for name, body in (("s/SKILL.md", SKILL), ("s/references/big.md", "b" * (MAX_FILE_BYTES // 4 - 10))):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body.encode()))
    assert main(["--home", str(tmp_path / "h"), "skills", "install", str(tgz)]) == 0
    assert (
        tmp_path / "h" / "skills" / "bomb" / "references" / "big.md"
    ).stat().st_size == MAX_FILE_BYTES // 4 - 10
