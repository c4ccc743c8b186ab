"""``mnemo sessions …`` and ``mnemo bench recall`` end to end through the CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mnemo.cli.main import main

REPO = Path(__file__).resolve().parents[2]

CHAT = {
    "sessions": [
        {
            "id": "s1",
            "started_at": "2024-03-01T10:00:00",
            "messages": [
                {"id": "m1", "speaker": "Ann", "content": "We adopted a beagle called Biscuit"},
                {"id": "m2", "speaker": "assistant", "content": "Congratulations on the new dog!"},
            ],
        },
        {
            "id": "s2",
            "started_at": "2024-03-09T10:00:00",
            "messages": [
                {"id": "m3", "speaker": "Ann", "content": "Biscuit chewed my slippers"},
            ],
        },
    ],
    "questions": [
        {"id": "q1", "question": "What is my dog's name?", "evidence": ["m1"], "category": "single-hop"},
        {"id": "q2", "question": "What did the beagle chew?", "evidence": ["m3"], "category": "single-hop"},
    ],
}


def run(home: Path, *argv: str) -> int:
    return main(["--home", str(home), *argv])


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    path = tmp_path / "ann.json"
    path.write_text(json.dumps(CHAT))
    return path


def test_import_list_show_and_search(home: Path, chat_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(home, "sessions", "import", str(chat_file), "--chat", "telegram:dm:7") == 0
    assert "imported 2 sessions, 3 messages into chat telegram:dm:7" in capsys.readouterr().out
    assert (home / "state.db").exists()

    assert run(home, "sessions", "list", "--chat", "telegram:dm:7") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and lines[0].split()[1] == "2024-03-09"
    first_id = lines[1].split()[0]

    assert run(home, "sessions", "show", first_id) == 0
    shown = capsys.readouterr().out
    assert "Ann: We adopted a beagle called Biscuit" in shown and "assistant: Congratulations" in shown

    assert run(home, "sessions", "search", "biscuit", "--chat", "telegram:dm:7") == 0
    out = capsys.readouterr().out
    assert "Biscuit chewed my slippers" in out and "We adopted a beagle" in out

    assert run(home, "sessions", "search", "adopting beagles", "--limit", "1", "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["count"] == 1
        and data["results"][0]["matches"][0]["text"] == "We adopted a beagle called Biscuit"
    )


def test_search_is_restricted_to_the_chats_named(
    home: Path, chat_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(home, "sessions", "import", str(chat_file), "--chat", "telegram:dm:7")
    run(home, "sessions", "import", str(chat_file))  # default chat: import:ann
    capsys.readouterr()
    run(home, "sessions", "search", "biscuit", "--chat", "import:ann", "--json")
    keys = {r["session_id"] for r in json.loads(capsys.readouterr().out)["results"]}
    run(home, "sessions", "list", "--chat", "import:ann", "--json")
    listed = {json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()}
    assert keys and keys <= listed


def test_a_large_import_reports_progress_on_stderr(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = {
        "sessions": [
            {
                "id": f"s{i}",
                "started_at": f"2024-01-{i + 1:02d}",
                "messages": [
                    {"id": f"s{i}m{j}", "speaker": "u", "content": f"message {j}"} for j in range(250)
                ],
            }
            for i in range(10)
        ]
    }
    path = tmp_path / "big.json"
    path.write_text(json.dumps(big))
    assert run(home, "sessions", "import", str(path)) == 0
    captured = capsys.readouterr()
    assert "importing big.json: 2500/2500 messages" in captured.err
    assert "2500 messages" in captured.out


def test_usage_errors_exit_2_with_a_message(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"sessions": [{"messages": [{"id": 1}]}]}')
    assert run(home, "sessions", "import", str(bad)) == 2
    assert "missing 'content'" in capsys.readouterr().err
    assert run(home, "sessions", "search", "   ") == 2
    assert "empty" in capsys.readouterr().err
    assert run(home, "bench", "recall", "--dataset", str(bad), "--k", "0") == 2
    assert "--k" in capsys.readouterr().err
    assert run(home, "sessions", "show", "missing") == 1


def test_bench_recall_prints_a_table_and_ends_with_one_json_line(
    home: Path, chat_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(home, "bench", "recall", "--dataset", str(chat_file), "--k", "1,3", "--json") == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("ann ") for line in lines)
    result = json.loads(lines[-1])
    assert set(result) == {"baseline", "shipped"}
    for scores in result.values():
        assert set(scores) == {
            "recall@1", "any_hit@1", "session_recall@1", "recall@3", "any_hit@3", "session_recall@3"
        }  # fmt: skip
        assert all(0.0 <= v <= 1.0 for v in scores.values())
    assert not (home / "state.db").exists()  # a fresh temporary profile, not the user's


def test_shipped_retriever_beats_the_baseline_by_30_percent_on_the_dev_dataset(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(home, "bench", "recall", "--dataset", str(REPO / "bench" / "data"), "--k", "10", "--json") == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["shipped"]["recall@10"] >= 1.3 * result["baseline"]["recall@10"]
