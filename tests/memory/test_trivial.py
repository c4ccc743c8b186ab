"""The shared trivial-prompt definition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mnemo.memory.trivial import TRIVIAL_PHRASES, is_trivial_prompt


@pytest.mark.parametrize(
    "text",
    [None, "", "   ", "\n\t", "/reset", "/cron list", "ok", "OK!", "okay.", "Thanks!!", "thank you",
     "Thank   you :)", "go ahead...", "LGTM", "k", "y", "nope", "sure?", "got it — ", "hi 👋", "thanks 👩‍💻", "yes!?"],
)  # fmt: skip
def test_trivial(text: str | None) -> None:
    assert is_trivial_prompt(text)


@pytest.mark.parametrize(
    "text",
    ["k8s", "note", "nothing", "yesterday", "okay so the deploy failed", "yes please", "no way",
     "thanks for the tip about Vim", "hello world", "done?! what about the DB", "👍", "what is k",
     "ok 2", "where does Alice live?"],
)  # fmt: skip
def test_not_trivial(text: str) -> None:
    assert not is_trivial_prompt(text)


@given(
    st.sampled_from(TRIVIAL_PHRASES),
    st.text(alphabet=" \t\n!?.,;:…—–()[]{}<>*&^%$#@+=~'\"`🙏", max_size=8),
    st.booleans(),
)
def test_every_phrase_followed_by_filler_is_trivial(phrase: str, tail: str, upper: bool) -> None:
    text = (phrase.upper() if upper else phrase) + tail
    assert is_trivial_prompt("  " + text)


@given(st.sampled_from(TRIVIAL_PHRASES), st.text(alphabet="abcxyz0123456789", min_size=1, max_size=4))
def test_a_phrase_glued_to_more_word_characters_is_not_trivial(phrase: str, tail: str) -> None:
    text = phrase + tail
    if text.lower() in TRIVIAL_PHRASES:  # "no" + "pe"
        return
    assert not is_trivial_prompt(text)
