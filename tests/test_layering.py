"""The dependency rules of DESIGN.md, enforced on the source.

    mnemo (cli, app) -> adapters -> gateway -> memory;   providers -> memory

* ``memory/`` and ``providers/`` import nothing from ``gateway/``, ``adapters/`` or the
  composition root (``mnemo.cli``, ``mnemo.app``);
* ``gateway/`` imports no adapter, nothing of the composition root and no platform
  library (``telegram``, ``discord``);
* ``adapters/`` import nothing of the composition root;
* only the LLM client module imports ``anthropic``;
* nothing imports the old top-level names (``gateway``, ``memory``, ...): everything
  lives under ``mnemo``;
* the emulator stays off the runtime path: outside tests only trial mode and the demo
  import it, and only inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mnemo", "gateway", "adapters", "memory", "providers")
OLD_TOP_LEVEL = ("gateway", "adapters", "memory", "providers")
COMPOSITION_ROOT = ("mnemo.cli", "mnemo.app", "mnemo.__main__")


def imports_of(path: Path, *, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = tree.body if top_level_only else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(name: str) -> str:
    return name.split(".", 1)[0]


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def violations(
    packages: tuple[str, ...], forbidden: tuple[str, ...], *, skip: tuple[str, ...] = ()
) -> list[str]:
    bad = []
    for package in packages:
        for path in modules(package):
            rel = str(path.relative_to(ROOT))
            if rel.startswith(skip):
                continue
            hits = sorted(n for n in imports_of(path) if within(n, forbidden))
            if hits:
                bad.append(f"{rel}: {hits}")
    return bad


def test_memory_and_providers_import_no_gateway_adapter_or_cli() -> None:
    forbidden = ("mnemo.gateway", "mnemo.adapters", *COMPOSITION_ROOT)
    assert not violations(("memory", "providers"), forbidden)


def test_gateway_imports_no_adapter_cli_or_platform_library() -> None:
    forbidden = ("mnemo.adapters", *COMPOSITION_ROOT, "telegram", "discord")
    assert not violations(("gateway",), forbidden)


def test_adapters_import_nothing_of_the_composition_root() -> None:
    assert not violations(("adapters",), COMPOSITION_ROOT)


def test_only_the_composition_root_imports_adapters() -> None:
    assert not violations(("gateway", "memory", "providers"), ("mnemo.adapters",))


def test_only_the_llm_client_imports_anthropic() -> None:
    users = sorted(
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in modules(package)
        if any(top(n) == "anthropic" for n in imports_of(path))
    )
    assert users == ["gateway/llm/client.py"]


@pytest.mark.parametrize("package", [*PACKAGES, "tests", "bench"])
def test_nothing_imports_the_old_top_level_names(package: str) -> None:
    assert not violations((package,), OLD_TOP_LEVEL)


def test_the_emulator_is_imported_lazily_and_only_by_trial_mode_and_demo() -> None:
    users = []
    for package in PACKAGES:
        for path in modules(package):
            rel = str(path.relative_to(ROOT))
            if rel.startswith("gateway/emulator/"):
                continue
            if any(within(n, ("mnemo.gateway.emulator",)) for n in imports_of(path, top_level_only=True)):
                users.append(f"{rel} (at import time)")
            elif any(within(n, ("mnemo.gateway.emulator",)) for n in imports_of(path)):
                users.append(rel)
    assert sorted(users) == ["mnemo/app.py", "mnemo/cli/demo.py"]


def test_the_rule_checker_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import telegram.ext\nfrom mnemo.gateway import config\nfrom . import y\n")
    assert imports_of(sample) == {"telegram.ext", "mnemo.gateway", "mnemo.gateway.config"}
