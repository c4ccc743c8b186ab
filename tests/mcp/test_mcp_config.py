"""``mcp.*`` and ``delegation.*`` in config.yaml: secrets named as ``${NAME}``, one clear
line per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mnemo.gateway.config import load_settings
from mnemo.gateway.errors import ConfigError


def write(home: Path, config: dict) -> None:
    (home / "config.yaml").write_text(yaml.safe_dump(config))


def test_env_and_header_values_come_from_dotenv_or_the_environment_and_are_secrets(home: Path) -> None:
    (home / ".env").write_text("NOTES_KEY=from-dotenv\n")
    write(
        home,
        {
            "mcp": {
                "servers": {
                    "notes": {"command": "notes-mcp", "env": {"KEY": "${NOTES_KEY}", "MODE": "plain"}},
                    "gh": {
                        "url": "https://x.example/mcp",
                        "headers": {"Authorization": "Bearer ${GH_TOKEN}"},
                    },
                }
            }
        },
    )
    settings = load_settings(home, environ={"GH_TOKEN": "from-env"})
    notes, gh = settings.mcp.servers["notes"], settings.mcp.servers["gh"]
    assert notes.env["KEY"].get_secret_value() == "from-dotenv" and notes.transport == "stdio"
    assert gh.headers["Authorization"].get_secret_value() == "Bearer from-env" and gh.transport == "http"
    assert "from-dotenv" not in repr(settings) and "from-env" not in repr(settings)
    assert {"from-dotenv", "Bearer from-env", "plain"} <= set(settings.secret_values())
    assert (notes.allowed, notes.tools, notes.timeout_s) == ("admins", "all", 30.0)
    assert settings.delegation.allowed == "admins"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"mcp": {"servers": {"gh": {"url": "https://x/mcp", "headers": {"A": "${NOPE}"}}}}},
         "mcp.servers.gh.headers.A: ${NOPE} is not set (in .env or the environment)"),
        ({"mcp": {"servers": {"both": {"command": "x", "url": "https://x"}}}},
         "mcp.servers.both: Value error, give either 'command' (stdio) or 'url' (streamable HTTP)"),
        ({"mcp": {"servers": {"none": {"tools": "all"}}}}, "give either 'command'"),
        ({"mcp": {"servers": {"u": {"url": "ftp://x"}}}}, "'url' must be an http:// or https:// URL"),
        ({"mcp": {"servers": {"h": {"command": "x", "headers": {"A": "b"}}}}}, "'headers' are for a 'url' server"),
        ({"mcp": {"servers": {"bad__name": {"command": "x"}}}}, "server names are letters and digits"),
        ({"mcp": {"servers": {"p": {"command": "x", "allowed": "everyone"}}}},
         "mcp.servers.p.allowed: Value error, must be 'admins', 'users' or a list of people as PLATFORM:ID"),
        ({"mcp": {"servers": {"p": {"command": "x", "allowed": ["bob"]}}}}, "people are PLATFORM:ID"),
        ({"delegation": {"allowed": ["telegram:1", "x"]}}, "delegation.allowed: Value error, people are PLATFORM:ID"),
        ({"mcp": {"servers": {"t": {"command": "x", "timeout_s": 0}}}}, "mcp.servers.t.timeout_s"),
    ],
)  # fmt: skip
def test_mistakes_are_named(home: Path, config: dict, message: str) -> None:
    write(home, config)
    with pytest.raises(ConfigError) as e:
        load_settings(home, environ={})
    assert message in str(e.value)
