"""``$MNEMO_HOME/.env`` as python-dotenv reads it (gateway/config.py ``read_dotenv``).

The hand-written reader this replaced kept the quotes of ``KEY="value" # note``, so
an API key was sent with quotes around it."""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemo.gateway.config import load_settings, read_dotenv
from mnemo.gateway.errors import ConfigError

KEY = "sk-ant-api03-" + "x" * 20


def test_a_quoted_key_with_a_comment_after_it_is_read_without_quotes(home: Path) -> None:
    (home / ".env").write_text(f'ANTHROPIC_API_KEY="{KEY}" # the work account\n')
    s = load_settings(home, environ={})
    assert s.llm.api_key is not None and s.llm.api_key.get_secret_value() == KEY


def test_export_comments_quotes_and_multiline_values(home: Path) -> None:
    (home / ".env").write_text(
        "# secrets\n"
        "\n"
        "export TELEGRAM_BOT_TOKEN=123:abc   # inline comment\n"
        "SINGLE='a # not a comment'\n"
        'DOUBLE="tab\\there"\n'
        'PEM="-----BEGIN KEY-----\n'
        "line two\n"
        '-----END KEY-----"\n'
        "EMPTY=\n"
        "HASH=#kept\n"
        "SPACED = value with spaces \n"
        "DOLLAR=pa$${word}\n"
    )
    assert read_dotenv(home / ".env") == {
        "TELEGRAM_BOT_TOKEN": "123:abc",
        "SINGLE": "a # not a comment",
        "DOUBLE": "tab\there",
        "PEM": "-----BEGIN KEY-----\nline two\n-----END KEY-----",
        "EMPTY": "",
        "HASH": "#kept",
        "SPACED": "value with spaces",
        "DOLLAR": "pa$${word}",  # no expansion: a secret is taken as written
    }


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("# ok\nGOOD=1\nthis is not a pair\n", 3),
        ("GOOD=1\n\n\nsk-ant-pasted-alone\n", 4),
        ('A="never closed\nB=2\n', 1),
        ("GOOD=1\nnot-a-name=1\n", 2),
    ],
)
def test_garbage_is_an_error_naming_the_line_never_the_value(home: Path, text: str, line: int) -> None:
    (home / ".env").write_text(text)
    with pytest.raises(ConfigError, match=rf"\.env:{line}: expected KEY=value") as e:
        read_dotenv(home / ".env")
    assert "sk-ant" not in str(e.value) and "never closed" not in str(e.value)


def test_no_file_is_no_variables(home: Path) -> None:
    assert read_dotenv(home / ".env") == {}


_SAFE = st.text(string.ascii_letters + string.digits + "-_.:/+=@!%^&*()[]{}<>?,;~ #'\\\"", max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    values=st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,20}", fullmatch=True), _SAFE.map(str.strip), max_size=6
    )
)
def test_any_value_written_double_quoted_reads_back_exactly(values: dict[str, str]) -> None:
    """What `mnemo` documents: wrap a value in double quotes (escaping \\ and ") and it
    reads back byte for byte, whatever it holds."""
    import tempfile

    body = "".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}" # note\n'
        for k, v in values.items()
    )
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ".env"
        path.write_text(body)
        assert read_dotenv(path) == values
