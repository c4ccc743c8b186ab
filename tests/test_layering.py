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
COMPOSITION_ROOT = ("mnemo.cli", "mnemo.app", "mnemo.wiring", "mnemo.__main__")


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


@pytest.mark.slow
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
    assert sorted(users) == ["mnemo/cli/demo.py", "mnemo/wiring/model.py"]


def test_the_rule_checker_sees_imports(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import telegram.ext\nfrom mnemo.gateway import config\nfrom . import y\n")
    assert imports_of(sample) == {"telegram.ext", "mnemo.gateway", "mnemo.gateway.config"}


# --- no cycle between the gateway's sub-packages ---------------------------------------
#
# The nodes are the sub-packages of ``gateway/`` (budgets, cron, delivery, emulator,
# inbound, jobs, llm, people, storage_pg, turns) plus the top-level modules
# (config, events, errors, logs, ports, commands, ...) as one group, ``(top)``. Every
# import counts: at module level, inside a function (a lazy import hides a cycle from
# the interpreter, not from the reader) and under ``TYPE_CHECKING`` (a type the checker
# needs is a dependency all the same). The top-level modules being the base every
# sub-package builds on, the group must import none of them.
#
# The storage modules are a node of their own: ``storage.py`` assembles every
# sub-system's migrations and repositories into one backend (``open_backend``), with
# ``storage_sqlite.py`` and ``storage_postgresql.py`` building each backend's, so they
# sit above them all by design, like the composition root; acyclicity then means no
# sub-package may import them.
GATEWAY_TOP = "(top)"
OWN_NODES = {"storage.py": "storage", "storage_sqlite.py": "storage", "storage_postgresql.py": "storage"}


def gateway_node(root: Path, module: str) -> str | None:
    """The node of ``mnemo.gateway…`` module ``module``; None outside the gateway."""
    parts = module.split(".")
    if parts[:2] != ["mnemo", "gateway"]:
        return None
    if len(parts) == 2:
        return GATEWAY_TOP  # gateway/__init__.py
    if (root / "gateway" / parts[2]).is_dir():
        return parts[2]
    return OWN_NODES.get(parts[2] + ".py", GATEWAY_TOP)


def imported_modules(path: Path, package: str) -> set[tuple[str, int]]:
    """Every module ``path`` imports, anywhere in it, with the line: relative imports
    resolved against ``package`` (the dotted package the file is in)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
            names.add((base, node.lineno))
            names.update((f"{base}.{alias.name}", node.lineno) for alias in node.names)
    return names


def gateway_import_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """node -> imported node -> where (``file:line``), for imports between distinct nodes."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in modules_under(root / "gateway"):
        rel = path.relative_to(root / "gateway")
        source = rel.parts[0] if len(rel.parts) > 1 else OWN_NODES.get(rel.name, GATEWAY_TOP)
        package = ".".join(["mnemo", "gateway", *rel.parts[:-1]])
        for name, line in sorted(imported_modules(path, package)):
            target = gateway_node(root, name)
            if target is not None and target != source:
                graph.setdefault(source, {}).setdefault(target, []).append(f"gateway/{rel}:{line}")
    return graph


def modules_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted({*graph, *(t for targets in graph.values() for t in targets)}):
        if node not in index:
            visit(node)
    return found


def describe_cycle(graph: dict[str, dict[str, list[str]]], component: list[str]) -> str:
    edges = [
        f"  {a} -> {b}: {', '.join(sorted(set(graph[a][b])))}"
        for a in component
        for b in sorted(graph.get(a, {}))
        if b in component
    ]
    return " <-> ".join(component) + "\n" + "\n".join(edges)


def test_the_gateway_sub_packages_import_each_other_without_a_cycle() -> None:
    graph = gateway_import_graph(ROOT)
    assert {"budgets", "inbound", "people", "turns"} <= set(graph), "the graph sees the tree"
    assert GATEWAY_TOP in graph["turns"], "and the top-level modules"
    found = cycles(graph)
    assert not found, "import cycles between gateway sub-packages:\n" + "\n".join(
        describe_cycle(graph, c) for c in found
    )


def test_the_cycle_checker_sees_lazy_type_checking_and_relative_imports(tmp_path: Path) -> None:
    gateway = tmp_path / "gateway"
    for folder in ("a", "b", "c"):
        (gateway / folder).mkdir(parents=True)
        (gateway / folder / "__init__.py").write_text("")
    (gateway / "config.py").write_text("")
    (gateway / "a" / "x.py").write_text("from mnemo.gateway.b.y import thing\n")
    (gateway / "b" / "y.py").write_text("def f():\n    from mnemo.gateway.c import z\n")
    (gateway / "c" / "z.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import x\n"
    )
    graph = gateway_import_graph(tmp_path)
    assert cycles(graph) == [["a", "b", "c"]]
    (gateway / "c" / "z.py").write_text("from mnemo.gateway import config\n")
    assert cycles(gateway_import_graph(tmp_path)) == []
    (gateway / "config.py").write_text("def load():\n    from mnemo.gateway.a.x import thing\n")
    assert cycles(gateway_import_graph(tmp_path)) == [[GATEWAY_TOP, "a", "b", "c"]]
