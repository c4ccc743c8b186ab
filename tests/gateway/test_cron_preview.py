"""``mnemo cron preview``: the next fire times of an expression, as the scheduler computes them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mnemo.cli.main import main


@pytest.fixture
def profile(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "TELEGRAM_", "DISCORD_", "MNEMO_")):
            monkeypatch.delenv(name)
    return home


def preview(home: Path, *argv: str) -> int:
    return main(["--home", str(home), "cron", "preview", *argv])


def test_json_is_exactly_a_list_of_times_with_their_offsets(profile: Path, capsys) -> None:
    code = preview(
        profile, "5 0 1 * *", "--tz", "Europe/Berlin", "--from", "2027-02-15", "--count", "3", "--json"
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {
        "times": ["2027-03-01T00:05:00+01:00", "2027-04-01T00:05:00+02:00", "2027-05-01T00:05:00+02:00"]
    }


def test_text_shows_the_spring_gap_rule(profile: Path, capsys) -> None:
    assert (
        preview(profile, "30 2 * * *", "--tz", "Europe/Berlin", "--from", "2027-03-27T12:00", "--count", "2")
        == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        "2027-03-28T03:00:00+02:00  Sun 28 Mar 2027 03:00 CEST",
        "2027-03-29T02:30:00+02:00  Mon 29 Mar 2027 02:30 CEST",
    ]


def test_from_is_inclusive_and_an_offset_wins_over_the_zone(profile: Path, capsys) -> None:
    assert (
        preview(profile, "0 8 * * *", "--tz", "Asia/Tokyo", "--from", "2027-01-01T08:00+09:00", "--json") == 0
    )
    times = json.loads(capsys.readouterr().out)["times"]
    assert times[0] == "2027-01-01T08:00:00+09:00" and len(times) == 5


def test_the_default_zone_is_the_configured_one(profile: Path, capsys) -> None:
    (profile / "config.yaml").write_text("gateway:\n  timezone: America/New_York\n")
    assert preview(profile, "@daily", "--from", "2027-07-01T12:00", "--count", "1", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"times": ["2027-07-02T00:00:00-04:00"]}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["0 8 * * 9"], "bad day-of-week field '9'"),
        (["0 8 * *"], "expected 5 fields"),
        (["0 0 30 2 *"], "never runs"),
        (["0 8 * * *", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
        (["0 8 * * *", "--from", "yesterday"], "invalid --from 'yesterday'"),
        (["0 8 * * *", "--count", "0"], "--count must be between 1 and 1000"),
    ],
)
def test_bad_input_is_one_clear_line_and_exit_2(profile: Path, capsys, argv: list[str], message: str) -> None:
    assert preview(profile, *argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_preview_touches_no_database(profile: Path, capsys) -> None:
    assert preview(profile, "@hourly", "--count", "1") == 0
    assert not (profile / "state.db").exists()
