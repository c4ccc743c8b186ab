from hypothesis import given
from hypothesis import strategies as st

from mnemo.memory.tokens import estimate_tokens


def test_ascii_is_about_four_characters_per_token():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2


def test_non_ascii_counts_one_token_per_character():
    assert estimate_tokens("日本語") == 3
    assert estimate_tokens("ab日") == 2


@given(st.text())
def test_fast_path_agrees_with_the_general_rule(text):
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    expected = (ascii_chars + 3) // 4 + (len(text) - ascii_chars) if text else 0
    assert estimate_tokens(text) == expected
