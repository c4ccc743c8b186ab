"""The dependency rules of DESIGN.md, enforced on the source:

* ``memory/`` imports nothing from ``gateway/`` or ``adapters/``;
* ``providers/`` imports nothing from ``gateway/`` or ``adapters/``;
* ``gateway/`` imports no platform library (``telegram``, ``discord``);
* only ``gateway/llm.py`` imports ``anthropic``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def top(name: str) -> str:
    return name.split(".", 1)[0]


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_memory_and_providers_do_not_import_gateway_or_adapters() -> None:
    bad = []
    for package in ("memory", "providers"):
        for path in modules(package):
            hits = {n for n in imports_of(path) if top(n) in ("gateway", "adapters")}
            if hits:
                bad.append(f"{path.relative_to(ROOT)}: {sorted(hits)}")
    assert not bad, "\n".join(bad)


def test_gateway_imports_no_platform_library() -> None:
    bad = []
    for path in modules("gateway"):
        hits = {n for n in imports_of(path) if top(n) in ("telegram", "discord")}
        if hits:
            bad.append(f"{path.relative_to(ROOT)}: {sorted(hits)}")
    assert not bad, "\n".join(bad)


def test_only_the_llm_client_imports_anthropic() -> None:
    users = sorted(
        str(path.relative_to(ROOT))
        for package in ("gateway", "adapters", "memory", "providers")
        for path in modules(package)
        if any(top(n) == "anthropic" for n in imports_of(path))
    )
    assert users == ["gateway/llm.py"]


def test_the_rule_checker_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import telegram.ext\nfrom gateway.config import Settings\nfrom . import y\n")
    assert imports_of(sample) == {"telegram.ext", "gateway.config"}
