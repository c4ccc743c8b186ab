"""The ``streaming`` settings: ``true``/``false`` shorthand, per-platform overrides,
DMs only unless groups are asked for, the edit interval's bounds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mnemo.gateway.config import load_settings
from mnemo.gateway.errors import ConfigError


def settings_from(home: Path, streaming: object) -> object:
    (home / "config.yaml").write_text(yaml.safe_dump({"streaming": streaming}))
    return load_settings(home, environ={}).streaming


def test_on_in_dms_by_default_with_a_one_second_interval(home: Path) -> None:
    s = load_settings(home, environ={}).streaming
    assert s.enabled and s.min_interval_s == 1.0
    assert s.applies("telegram", dm=True) and s.applies("discord", dm=True) and s.applies("web", dm=True)
    assert not s.applies("telegram", dm=False), "groups and shared rooms do not stream by default"


def test_true_and_false_are_shorthand_for_enabled(home: Path) -> None:
    assert not settings_from(home, False).applies("telegram", dm=True)
    assert settings_from(home, True).applies("telegram", dm=True)


def test_per_platform_overrides_win_both_ways(home: Path) -> None:
    s = settings_from(home, {"enabled": False, "platforms": {"web": True}})
    assert s.applies("web", dm=True) and not s.applies("telegram", dm=True)
    s = settings_from(home, {"platforms": {"discord": False}, "groups": True, "min_interval_s": 2.5})
    assert not s.applies("discord", dm=True) and s.applies("telegram", dm=False) and s.min_interval_s == 2.5


@pytest.mark.parametrize(
    "bad", [{"min_interval_s": 0}, {"min_interval_s": 120}, {"enable": True}, "yes please"]
)
def test_bad_values_are_one_clear_error(home: Path, bad: object) -> None:
    with pytest.raises(ConfigError) as e:
        settings_from(home, bad)
    assert "streaming" in str(e.value)
