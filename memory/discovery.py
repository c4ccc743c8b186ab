"""Finding memory providers: installed packages and folders in the profile.

Two sources, one contract (``memory.provider.MemoryProvider``):

1. **Entry points** in the group ``mnemo.memory_providers``; the value names the
   provider class. mnemo's own holographic provider registers exactly like a third
   party would (``pyproject.toml``)::

       [project.entry-points."mnemo.memory_providers"]
       holographic = "mnemo.providers.holographic:HolographicProvider"

2. **Folders** ``$MNEMO_HOME/providers/<name>/`` holding a plugin module — either a
   package (``__init__.py``) or a single ``provider.py`` — that defines
   ``PROVIDER = MyProvider`` (the class, constructible without arguments). A
   package's relative imports work. Folders without such a module are only provider
   data (e.g. ``holographic/facts.db``) and are skipped. ``<name>`` must equal the
   class's ``name``.

On a name clash the entry point wins and the folder is reported as shadowed. A plugin
that fails to import is listed as unavailable with the error, never hidden.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import structlog

from mnemo.memory.errors import InvalidIdentifier, ProviderError
from mnemo.memory.provider import Availability, MemoryProvider
from mnemo.memory.provider_config import read_provider_config
from mnemo.memory.scope import validate_id

log = structlog.get_logger(__name__)

ENTRY_POINT_GROUP = "mnemo.memory_providers"
PLUGIN_ATTR = "PROVIDER"
_FOLDER_MODULE_PREFIX = "mnemo_home_providers"

Factory = Callable[[], MemoryProvider]


@dataclass(frozen=True, slots=True)
class ProviderInfo:
    name: str
    description: str
    available: bool
    reason: str  # why not available ("" when it is)
    factory: Factory | None  # None when the plugin could not even be loaded
    source: str  # "entry point: <module:attr>" or "folder: <path>"


def _check_class(obj: Any, where: str) -> type[MemoryProvider]:
    if not (isinstance(obj, type) and issubclass(obj, MemoryProvider)):
        raise ProviderError(f"{where}: expected a MemoryProvider subclass, got {obj!r}")
    if not isinstance(getattr(obj, "name", None), str):
        raise ProviderError(f"{where}: {obj.__name__} has no 'name'")
    return obj


def _folder_module(folder: Path) -> Path | None:
    for candidate in (folder / "__init__.py", folder / "provider.py"):
        if candidate.is_file():
            return candidate
    return None


def _import_folder(name: str, module_file: Path) -> ModuleType:
    qualified = f"{_FOLDER_MODULE_PREFIX}_{name}"
    is_package = module_file.name == "__init__.py"
    spec = importlib.util.spec_from_file_location(
        qualified,
        module_file,
        submodule_search_locations=[str(module_file.parent)] if is_package else None,
    )
    if spec is None or spec.loader is None:
        raise ProviderError(f"{module_file}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    # Registered before executing so relative imports inside the package resolve.
    sys.modules[qualified] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(qualified, None)
        raise
    return module


def _entry_point_sources() -> dict[str, tuple[str, Callable[[], Any]]]:
    out: dict[str, tuple[str, Callable[[], Any]]] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        out.setdefault(ep.name, (f"entry point: {ep.value}", ep.load))
    return out


def _folder_sources(home: Path) -> dict[str, tuple[str, Callable[[], Any]]]:
    out: dict[str, tuple[str, Callable[[], Any]]] = {}
    root = Path(home) / "providers"
    if not root.is_dir():
        return out
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith((".", "_")):
            continue
        module_file = _folder_module(folder)
        if module_file is None:
            continue
        try:
            validate_id("provider", folder.name)
        except InvalidIdentifier:
            continue

        def load(name: str = folder.name, path: Path = module_file) -> Any:
            module = _import_folder(name, path)
            if not hasattr(module, PLUGIN_ATTR):
                raise ProviderError(f"{path}: defines no {PLUGIN_ATTR} = <MemoryProvider subclass>")
            return getattr(module, PLUGIN_ATTR)

        out[folder.name] = (f"folder: {folder}", load)
    return out


def _sources(home: Path) -> dict[str, tuple[str, Callable[[], Any]]]:
    found = _entry_point_sources()
    for name, (where, load) in _folder_sources(home).items():
        if name in found:
            log.warning("provider folder shadowed by an installed provider", provider=name, folder=where)
            continue
        found[name] = (where, load)
    return dict(sorted(found.items()))


def _resolve(name: str, where: str, load: Callable[[], Any]) -> type[MemoryProvider]:
    try:
        cls = _check_class(load(), where)
    except ProviderError:
        raise
    except Exception as e:
        raise ProviderError(f"{where}: failed to load: {type(e).__name__}: {e}") from e
    if cls.name != name:
        raise ProviderError(f"{where}: registered as {name!r} but its name is {cls.name!r}")
    return cls


def discover(home: Path) -> list[ProviderInfo]:
    """Every provider that can be found, with whether it could run here and why not.

    Availability uses each provider's stored settings (``providers/<name>/``); like
    ``is_available`` itself, it never touches the network.
    """
    out: list[ProviderInfo] = []
    for name, (where, load) in _sources(home).items():
        try:
            cls = _resolve(name, where, load)
        except ProviderError as e:
            out.append(ProviderInfo(name, "", False, str(e), None, where))
            continue
        out.append(ProviderInfo(name, cls.description, *_availability(cls, home), cls, where))
    return out


def _availability(cls: type[MemoryProvider], home: Path) -> tuple[bool, str]:
    try:
        provider = cls()
        config = read_provider_config(home, cls.name, provider.get_config_schema())
        result = provider.is_available(home, config)
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    if not isinstance(result, Availability):
        return False, f"is_available returned {type(result).__name__}, not Availability"
    return result.ok, result.reason


def load_provider(name: str, home: Path) -> MemoryProvider:
    """A new, uninitialized instance of provider ``name`` (settings are read and the
    provider initialized by ``MemoryManager.start``). Raises ``ProviderError`` for an
    unknown name (listing the known ones) or a plugin that cannot be loaded."""
    sources = _sources(home)
    if name not in sources:
        known = ", ".join(sources) or "none installed"
        raise ProviderError(f"unknown memory provider {name!r} (known: {known})")
    where, load = sources[name]
    return _resolve(name, where, load)()


def provider_config(home: Path, provider: MemoryProvider) -> Mapping[str, Any]:
    """The stored settings of ``provider`` with schema defaults."""
    return read_provider_config(home, provider.name, provider.get_config_schema())
