"""The storage seam stays typed and nobody outside it asks which backend this is
(DESIGN.md, "One backend seam"; issue 24 item 3).

* ``StorageBackend`` names each repository by its port: no ``Any`` in its annotations.
* Outside the storage modules no code branches on the backend: no ``backend.name ==``
  / ``!=``, no ``settings.database.is_postgresql``, no comparison with the names
  ``"sqlite"`` / ``"postgresql"``. The backend builds what differs instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mnemo.gateway.storage import StorageBackend

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mnemo", "gateway", "adapters", "memory", "providers")
# Where a backend may be told apart: the storage modules themselves.
STORAGE = (
    "gateway/storage.py",
    "gateway/storage_sqlite.py",
    "gateway/storage_postgresql.py",
    "gateway/storage_pg/",
    "memory/pg/",
    "memory/db.py",
)
BACKEND_NAMES = {"sqlite", "postgresql"}


def _asks_which_backend(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "is_postgresql":
        return True
    if not isinstance(node, ast.Compare):
        return False
    sides = [node.left, *node.comparators]
    if not any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
        return False
    names = any(isinstance(s, ast.Constant) and s.value in BACKEND_NAMES for s in sides)
    backend_name = any(
        isinstance(s, ast.Attribute)
        and s.attr == "name"
        and isinstance(s.value, ast.Name | ast.Attribute)
        and re.search(r"backend", ast.unparse(s.value), re.IGNORECASE) is not None
        for s in sides
    )
    return names or backend_name


def branches() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if "__pycache__" in path.parts or rel.startswith(STORAGE):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            lines = sorted({n.lineno for n in ast.walk(tree) if _asks_which_backend(n)})
            if lines:
                found[rel] = lines
    return found


def test_storage_backend_names_every_repository_by_its_port_never_any() -> None:
    annotations = StorageBackend.__annotations__
    assert len(annotations) >= 20
    untyped = {name: a for name, a in annotations.items() if re.search(r"\bAny\b", str(a))}
    assert untyped == {}


def test_no_code_outside_the_storage_modules_asks_which_backend_it_runs_on() -> None:
    assert branches() == {}, "the backend builds what differs: add it to StorageBackend instead"


def test_the_counter_sees_each_way_of_asking(tmp_path: Path) -> None:
    sample = (
        "if backend.name == 'sqlite': pass\n"
        "if self.backend.name != 'postgresql': pass\n"
        "if settings.database.is_postgresql: pass\n"
        "x = 'postgresql' == kind\n"
        "y = app.name == 'other'\n"
        '"""a docstring naming is_postgresql is no branch"""\n'
    )
    tree = ast.parse(sample)
    assert sorted({n.lineno for n in ast.walk(tree) if _asks_which_backend(n)}) == [1, 2, 3, 4]
