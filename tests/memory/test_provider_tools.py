"""The shared provider tool schemas and settings lookup (``memory.provider_tools``)."""

from __future__ import annotations

import pytest

from mnemo.memory.provider_tools import (
    SharedTools,
    conclude_tool,
    profile_tool,
    remember_tool,
    search_tool,
    setting,
    timeout_field,
    top_k_field,
)


def test_setting_prefers_config_then_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MNEMO_TEST_URL", "http://env")
    assert (
        setting({"base_url": "http://config"}, "base_url", "MNEMO_TEST_URL", "http://default")
        == "http://config"
    )
    assert setting({"base_url": ""}, "base_url", "MNEMO_TEST_URL", "http://default") == "http://env"
    monkeypatch.setenv("MNEMO_TEST_URL", "")
    assert setting({}, "base_url", "MNEMO_TEST_URL", "http://default") == "http://default"
    monkeypatch.delenv("MNEMO_TEST_URL")
    assert setting({"base_url": None}, "base_url", "MNEMO_TEST_URL") == ""


def test_search_tool_bounds_the_limit_and_requires_a_query() -> None:
    tool = search_tool("acme", "Acme", max_limit=20)
    assert tool.name == "acme_search"
    assert tool.description == "Search Acme's long-term memories of the user you are talking to."
    assert tool.input_schema["required"] == ["query"]
    assert tool.input_schema["properties"]["limit"] == {"type": "integer", "minimum": 1, "maximum": 20}
    assert tool.durable_args == ()
    assert (
        search_tool("acme", "Acme", description="Search the messages.").description == "Search the messages."
    )


def test_write_tools_mark_their_one_argument_durable() -> None:
    remember, conclude = remember_tool("acme", "Acme"), conclude_tool("acme", "Acme")
    assert (remember.name, remember.durable_args, remember.input_schema["required"]) == (
        "acme_remember",
        ("content",),
        ["content"],
    )
    assert (conclude.name, conclude.durable_args, conclude.input_schema["required"]) == (
        "acme_conclude",
        ("conclusion",),
        ["conclusion"],
    )
    assert "in Acme" in remember.description and "in Acme" in conclude.description
    profile = profile_tool("acme", "What Acme holds.")
    assert profile.to_api() == {
        "name": "acme_profile",
        "description": "What Acme holds.",
        "input_schema": {"type": "object", "properties": {}},
    }


def test_shared_tools_name_their_write_verb_and_argument() -> None:
    remember = SharedTools.standard("acme", "Acme", "What Acme holds.")
    conclude = SharedTools.standard("acme", "Acme", "What Acme holds.", conclude=True, search="Find.")
    assert [t.name for t in remember.schemas()] == ["acme_profile", "acme_search", "acme_remember"]
    assert (remember.verb, remember.write_arg) == ("remember", "content")
    assert (conclude.verb, conclude.write_arg) == ("conclude", "conclusion")
    assert conclude.search.description == "Find." and conclude.profile.description == "What Acme holds."


def test_common_settings_bound_their_values() -> None:
    assert (top_k_field().key, top_k_field().default, top_k_field().maximum) == ("top_k", 5, 50)
    timeout = timeout_field()
    assert (timeout.key, timeout.default, timeout.minimum, timeout.maximum) == ("timeout_s", 10.0, 0.1, 300)
