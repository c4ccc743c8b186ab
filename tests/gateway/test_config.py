from pathlib import Path

import pytest
from pydantic import ValidationError

from mnemo.gateway.config import load_settings, read_dotenv
from mnemo.gateway.errors import ConfigError


def test_defaults_start_in_trial_mode(home: Path) -> None:
    s = load_settings(home, environ={})
    assert s.trial_mode
    assert s.memory.memory_char_limit == 2200 and s.memory.user_char_limit == 1375
    assert s.state_db == home.resolve() / "state.db"


def test_unknown_key_names_the_key_and_the_allowed_keys(home: Path) -> None:
    (home / "config.yaml").write_text("memory:\n  memroy_char_limit: 10\n")
    with pytest.raises(ConfigError) as e:
        load_settings(home, environ={})
    assert "memory.memroy_char_limit: unknown key" in str(e.value)
    assert "memory_char_limit" in str(e.value)


def test_bad_choice_lists_allowed_values(home: Path) -> None:
    (home / "config.yaml").write_text("memory:\n  shared_write: everyone\n")
    with pytest.raises(ConfigError) as e:
        load_settings(home, environ={})
    assert "memory.shared_write: 'everyone' is not allowed (allowed: 'admins', 'all')" in str(e.value)


def test_environment_beats_dotenv_beats_yaml(home: Path) -> None:
    (home / "config.yaml").write_text("llm:\n  model: from-yaml\n  aux_model: from-yaml\n")
    (home / ".env").write_text("MNEMO_MODEL=from-dotenv\nMNEMO_AUX_MODEL='from-dotenv'\n")
    s = load_settings(home, environ={"MNEMO_MODEL": "from-env"})
    assert s.llm.model == "from-env"
    assert s.llm.aux_model == "from-dotenv"


def test_list_variables_are_comma_separated(home: Path) -> None:
    s = load_settings(
        home, environ={"MNEMO_ADMINS": "telegram:1, discord:2,,", "TELEGRAM_ALLOWED_USERS": "5"}
    )
    assert s.access.admins == ("telegram:1", "discord:2")
    assert s.telegram.allowed_users == ("5",)


def test_home_from_flag_beats_environment(tmp_path: Path) -> None:
    s = load_settings(tmp_path / "a", environ={"MNEMO_HOME": str(tmp_path / "b")})
    assert s.home == (tmp_path / "a").resolve()
    s = load_settings(None, environ={"MNEMO_HOME": str(tmp_path / "b")})
    assert s.home == (tmp_path / "b").resolve()


def test_settings_are_frozen(home: Path) -> None:
    s = load_settings(home, environ={})
    with pytest.raises(ValidationError, match="frozen"):
        s.memory.nudge_interval = 3  # type: ignore[misc]  # assigning a frozen field is the point of the test


def test_dotenv_rejects_garbage_with_line_number(home: Path) -> None:
    (home / ".env").write_text("# ok\nGOOD=1\nthis is not a pair\n")
    with pytest.raises(ConfigError, match=r"\.env:3"):
        read_dotenv(home / ".env")


def test_platform_token_without_key_is_not_trial_mode(home: Path) -> None:
    s = load_settings(home, environ={"TELEGRAM_BOT_TOKEN": "123456:" + "a" * 35})
    assert not s.trial_mode and not s.has_llm_endpoint and s.platform_tokens == ("telegram",)
