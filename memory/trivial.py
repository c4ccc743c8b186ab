"""THE definition of a trivial prompt: one carrying no signal worth a memory lookup.

The agent's per-turn prefetch gate and any provider-side classifier import this one
function, so the two can never disagree about what "trivial" means.

Trivial: empty or whitespace-only text, a slash command, or one of ``TRIVIAL_PHRASES``
followed only by whitespace, punctuation or symbols (``"ok!"``, ``"thanks 🙏"``,
``"Go ahead..."``). A phrase that merely starts a word is not trivial: ``"k8s"``,
``"note"``, ``"yesterday"``, ``"okay so the deploy failed"``.
"""

from __future__ import annotations

import re
import unicodedata

TRIVIAL_PHRASES: tuple[str, ...] = (
    "yes", "no", "ok", "okay", "sure", "thanks", "thank you", "y", "n", "yep", "nope",
    "yeah", "nah", "hi", "hey", "hello", "yo", "sup", "continue", "go ahead", "do it",
    "proceed", "got it", "cool", "nice", "great", "done", "next", "lgtm", "k",
)  # fmt: skip

# Longest first, so "thank you" is tried before a shorter phrase could match its start;
# inner spaces of a phrase may be any run of whitespace.
_PHRASE = re.compile(
    "(?:"
    + "|".join(
        r"\s+".join(re.escape(w) for w in p.split()) for p in sorted(TRIVIAL_PHRASES, key=len, reverse=True)
    )
    + ")",
    re.IGNORECASE,
)


def _is_filler(ch: str) -> bool:
    # Whitespace, punctuation (P*), symbols (S*: emoji, "+", "$", "~") and the
    # invisible parts of emoji sequences (joiners, variation selectors).
    cat = unicodedata.category(ch)
    return ch.isspace() or cat[0] in "PS" or cat in ("Cf", "Mn", "Me")


def is_trivial_prompt(text: str | None) -> bool:
    if not text:
        return True
    stripped = text.strip()
    if not stripped or stripped.startswith("/"):
        return True
    m = _PHRASE.match(stripped)
    if m is None:
        return False
    return all(_is_filler(ch) for ch in stripped[m.end() :])
