"""What ``pip install`` puts into site-packages: one ``mnemo`` namespace and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


SUBPACKAGES = ("gateway", "adapters", "memory", "providers")


def test_the_top_level_folders_are_mnemo_subpackages_through_relative_symlinks() -> None:
    for name in SUBPACKAGES:
        link = ROOT / "mnemo" / name
        assert link.is_symlink(), f"mnemo/{name} must be a symlink to ../{name}"
        # Relative, so a clone anywhere (and a wheel build) resolves it.
        assert Path(link.readlink()) == Path("..") / name


def test_find_installs_every_package_folder_and_only_the_mnemo_namespace() -> None:
    from setuptools import find_packages

    find = project()["tool"]["setuptools"]["packages"]["find"]
    found = set(find_packages(where=str(ROOT), include=find["include"]))
    expected = {"mnemo"}
    for top_name in ("mnemo", *SUBPACKAGES):
        for init in (ROOT / top_name).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top_name)
            prefix = "mnemo" if top_name == "mnemo" else f"mnemo.{top_name}"
            expected.add(".".join([prefix, *rel.parts]))
    assert expected <= found, f"not installed: {sorted(expected - found)}"
    assert all(p == "mnemo" or p.startswith("mnemo.") for p in found)


def test_entry_points_name_the_namespace() -> None:
    meta = project()["project"]
    assert meta["scripts"]["mnemo"] == "mnemo.cli.main:main"
    providers = meta["entry-points"]["mnemo.memory_providers"]
    assert providers["holographic"] == "mnemo.providers.holographic:HolographicProvider"
    # Our own providers register through the same entry point a third party would use.
    for name, target in providers.items():
        assert target.startswith(f"mnemo.providers.{name}:"), (name, target)


@pytest.mark.slow
def test_the_wheel_holds_only_mnemo_and_its_dist_info(tmp_path: Path) -> None:
    # Built from a copy: an in-tree build rewrites mnemo.egg-info and build/ while tests
    # running in parallel read the package's metadata (entry points) from there.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT,
        source,
        symlinks=True,  # mnemo/gateway -> ../gateway stays a relative link inside the copy
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
        ),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("mnemo-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/", 1)[0] for n in names} == {
        "mnemo",
        f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info",
    }
    assert "mnemo/adapters/web_static/index.html" in names
    assert "mnemo/gateway/llm/client.py" in names
    assert "mnemo/py.typed" in names


def test_python_dash_m_mnemo_is_the_mnemo_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mnemo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: mnemo ")


def test_version_is_written_once_and_printed_by_mnemo_dash_dash_version() -> None:
    import importlib.metadata

    import mnemo

    assert "version" in project()["project"]["dynamic"]
    assert importlib.metadata.version("mnemo") == mnemo.__version__
    out = subprocess.run(
        [sys.executable, "-m", "mnemo", "--version"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"mnemo {mnemo.__version__}"
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert mnemo.__version__ in (ROOT / "CHANGELOG.md").read_text()
