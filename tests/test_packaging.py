"""What ``pip install`` puts into site-packages: one ``mnemo`` namespace and nothing else."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_package_folder_is_listed_under_the_mnemo_namespace() -> None:
    setuptools = project()["tool"]["setuptools"]
    mapping = setuptools["package-dir"]
    found = set()
    for name, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([name, *rel.parts]))
    listed = set(setuptools["packages"])
    assert found <= listed, f"missing from [tool.setuptools] packages: {sorted(found - listed)}"
    assert all(p == "mnemo" or p.startswith("mnemo.") for p in listed)


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
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=600,
    )
    (wheel,) = tmp_path.glob("mnemo-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/", 1)[0] for n in names} == {"mnemo", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert "mnemo/adapters/web_static/index.html" in names
    assert "mnemo/gateway/llm/client.py" in names


def test_python_dash_m_mnemo_is_the_mnemo_command() -> None:
    out = subprocess.run([sys.executable, "-m", "mnemo", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: mnemo ")
