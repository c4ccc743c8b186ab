"""Finding providers (entry points and profile folders), their stored settings, and the
contract every discovered provider must honour."""

from __future__ import annotations

import json
import re
import stat
import textwrap
import tomllib
from pathlib import Path

import pytest

from mnemo.memory.discovery import ProviderInfo, discover, load_provider
from mnemo.memory.errors import ProviderError
from mnemo.memory.provider import (
    Availability,
    MemoryProvider,
    ProviderContext,
    Recall,
    ToolSchema,
)
from mnemo.memory.provider_config import (
    ConfigField,
    ConfigKind,
    read_provider_config,
    write_provider_config,
)
from mnemo.memory.scope import AgentContext, UserRef

# The providers this distribution registers through its entry points (pyproject.toml).
SHIPPED = set(
    tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"][
        "entry-points"
    ]["mnemo.memory_providers"]
)

PLUGIN_IMPL = """
from mnemo.memory.provider import Availability, MemoryProvider, Recall

class EchoProvider(MemoryProvider):
    name = "{name}"
    description = "echoes the query back"

    def is_available(self, home, config):
        return Availability(True)

    def initialize(self, home, config):
        pass

    def prefetch(self, query, ctx):
        return Recall("echo: " + query, 1)

    def get_tool_schemas(self):
        return ()

    def handle_tool_call(self, name, args, ctx):
        return "{{}}"
"""


def write_plugin(home: Path, name: str, files: dict[str, str]) -> Path:
    folder = home / "providers" / name
    folder.mkdir(parents=True)
    for filename, text in files.items():
        (folder / filename).write_text(textwrap.dedent(text))
    return folder


def by_name(home: Path) -> dict[str, ProviderInfo]:
    return {i.name: i for i in discover(home)}


def test_the_holographic_provider_comes_from_its_entry_point(home: Path) -> None:
    info = by_name(home)["holographic"]
    assert info.available and info.reason == ""
    assert info.source == "entry point: mnemo.providers.holographic:HolographicProvider"
    assert isinstance(load_provider("holographic", home), MemoryProvider)


def test_a_package_folder_with_relative_imports_is_a_provider(home: Path) -> None:
    write_plugin(
        home,
        "echo",
        {
            "impl.py": PLUGIN_IMPL.format(name="echo"),
            "__init__.py": "from .impl import EchoProvider as PROVIDER\n",
        },
    )
    info = by_name(home)["echo"]
    assert info.available and info.description == "echoes the query back"
    provider = load_provider("echo", home)
    ctx = ProviderContext("s", "c", "web", None, AgentContext.PRIMARY, home)
    assert provider.prefetch("hi there", ctx) == Recall("echo: hi there", 1)


def test_a_single_provider_module_is_a_provider(home: Path) -> None:
    write_plugin(
        home, "solo", {"provider.py": PLUGIN_IMPL.format(name="solo") + "\nPROVIDER = EchoProvider\n"}
    )
    assert by_name(home)["solo"].available


def test_data_only_folders_are_not_providers(home: Path) -> None:
    (home / "providers" / "holographic").mkdir(parents=True)
    (home / "providers" / "holographic" / "facts.db").write_bytes(b"")
    (home / "providers" / "notes").mkdir()
    assert set(by_name(home)) == SHIPPED


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({"__init__.py": "this is not python ("}, "SyntaxError"),
        ({"__init__.py": "X = 1\n"}, "defines no PROVIDER"),
        ({"__init__.py": "PROVIDER = dict\n"}, "expected a MemoryProvider subclass"),
        (
            {"__init__.py": PLUGIN_IMPL.format(name="other") + "\nPROVIDER = EchoProvider\n"},
            "its name is 'other'",
        ),
        ({"__init__.py": "import no_such_module_anywhere\n"}, "ModuleNotFoundError"),
    ],
)
def test_a_broken_folder_plugin_is_listed_with_the_reason(
    home: Path, files: dict[str, str], reason: str
) -> None:
    write_plugin(home, "broken", files)
    info = by_name(home)["broken"]
    assert not info.available and reason in info.reason and info.factory is None
    with pytest.raises(ProviderError, match=reason):
        load_provider("broken", home)


def test_an_installed_provider_shadows_a_folder_of_the_same_name(home: Path) -> None:
    write_plugin(
        home,
        "holographic",
        {"__init__.py": PLUGIN_IMPL.format(name="holographic") + "\nPROVIDER = EchoProvider\n"},
    )
    assert by_name(home)["holographic"].source.startswith("entry point")
    assert type(load_provider("holographic", home)).__name__ == "HolographicProvider"


def test_an_unknown_name_lists_the_known_ones(home: Path) -> None:
    known = re.escape(", ".join(sorted(SHIPPED)))
    with pytest.raises(ProviderError, match=rf"unknown memory provider 'mem9' \(known: {known}\)"):
        load_provider("mem9", home)


def test_unavailability_is_explained(home: Path) -> None:
    write_plugin(
        home,
        "needy",
        {
            "__init__.py": PLUGIN_IMPL.format(name="needy").replace(
                "return Availability(True)", "return Availability(bool(config.get('key')), 'needs key')"
            )
            + "\n    def get_config_schema(self):\n        from memory.provider_config import ConfigField\n"
            "        return (ConfigField('key', 'an API key', secret=True, required=True),)\n"
            + "\nPROVIDER = EchoProvider\n"
        },
    )
    info = by_name(home)["needy"]
    assert not info.available and info.reason == "needs key"
    load_provider("needy", home).save_config({"key": "s3cret"}, home)
    assert by_name(home)["needy"].available


# --- provider settings ----------------------------------------------------------------
SCHEMA = (
    ConfigField("url", "where", required=True),
    ConfigField("depth", "how deep", ConfigKind.INTEGER, 3, minimum=1, maximum=9),
    ConfigField("ratio", "how much", ConfigKind.NUMBER, 0.5),
    ConfigField("fast", "go fast", ConfigKind.BOOLEAN, False),
    ConfigField("mode", "which", ConfigKind.CHOICE, "a", choices=("a", "b")),
    ConfigField("token", "secret token", secret=True),
)


def test_settings_round_trip_with_secrets_kept_apart(home: Path) -> None:
    path = write_provider_config(
        home, "demo", SCHEMA, {"url": "http://x", "depth": "5", "fast": "yes", "token": "t0k"}
    )
    assert json.loads(path.read_text()) == {"url": "http://x", "depth": 5, "fast": True}
    secrets = path.with_name("secrets.json")
    assert json.loads(secrets.read_text()) == {"token": "t0k"}
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert read_provider_config(home, "demo", SCHEMA) == {
        "url": "http://x", "depth": 5, "ratio": 0.5, "fast": True, "mode": "a", "token": "t0k"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"depth": "5"}, "required setting(s) missing: url"),
        ({"url": "u", "colour": "red"}, "unknown setting(s) colour"),
        ({"url": "u", "depth": "ten"}, "depth: expected an integer, got 'ten'"),
        ({"url": "u", "depth": "10"}, "above the maximum"),
        ({"url": "u", "depth": 2.5}, "expected an integer"),
        ({"url": "u", "fast": "maybe"}, "expected yes/no"),
        ({"url": "u", "mode": "c"}, "allowed: a, b"),
    ],
)
def test_bad_settings_name_the_field(home: Path, values: dict[str, object], message: str) -> None:
    with pytest.raises(ProviderError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_provider_config(home, "demo", SCHEMA, values)
    assert not (home / "providers" / "demo" / "config.json").exists()


def test_an_unreadable_settings_file_is_an_error_not_empty_settings(home: Path) -> None:
    folder = home / "providers" / "demo"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ProviderError, match="cannot read provider settings"):
        read_provider_config(home, "demo", SCHEMA)


# --- the contract, for every installed provider ------------------------------------------
INSTALLED = [i.name for i in discover(Path("/nonexistent-mnemo-home"))]


@pytest.mark.parametrize("name", INSTALLED)
def test_provider_contract(name: str, home: Path) -> None:
    provider = load_provider(name, home)
    assert provider.name == name and provider.description
    config = read_provider_config(home, name, provider.get_config_schema())
    availability = provider.is_available(home, config)
    assert isinstance(availability, Availability)
    if not availability.ok:  # e.g. a remote provider without credentials: it must say why
        assert availability.reason
        return
    provider.initialize(home, config)
    try:
        ctx = ProviderContext("s", "c", "telegram", UserRef("telegram", "1"), AgentContext.PRIMARY, home)
        schemas = list(provider.get_tool_schemas())
        assert all(isinstance(s, ToolSchema) for s in schemas)
        assert len({s.name for s in schemas}) == len(schemas)
        for s in schemas:
            api = s.to_api()
            assert api["input_schema"]["type"] == "object"
            json.dumps(api)
            json.loads(provider.handle_tool_call(s.name, {}, ctx))  # bad args: JSON, not an exception
        json.loads(provider.handle_tool_call("not_a_tool_of_yours", {}, ctx))
        recall = provider.prefetch("what do you remember about me?", ctx)
        assert isinstance(recall, Recall) and isinstance(recall.text, str)
        assert provider.system_prompt_block() == provider.system_prompt_block()
        for path in provider.backup_paths(home):
            assert Path(path).resolve().is_relative_to(home.resolve())
        saved = provider.save_config(
            {f.key: f.default for f in provider.get_config_schema() if f.default is not None}, home
        )
        assert saved.is_relative_to(home)
    finally:
        provider.shutdown()
    provider.shutdown()  # idempotent
