"""The skill guard: the memory threat scanner plus rules for what a skill may teach.

A skill reaches the model as instructions, so everything in it goes through
:func:`mnemo.memory.threats.scan` (injection, exfiltration, secrets, hidden HTML,
invisible and control characters) and then the skill rules below. The refusal names
the rule (``pipe_to_shell``, ``download_and_run``, ``credential_access``,
``disable_safety``, or the scanner's category).

Where the line is: a skill may *show* how to call an API with curl
(``curl -s https://api.example.com/v1/items -H "Authorization: Bearer <token>"``) — a
request whose output goes to the terminal or a file. It may not pipe a download into
an interpreter (``curl … | sh``, ``bash <(curl …)``, ``eval "$(wget …)"``), fetch a
file and then run it (``curl -o x.sh … && sh x.sh``, ``chmod +x``), read SSH keys or
credential stores, or tell the agent to turn off its safety checks. Note that the
memory scanner also refuses a curl line that interpolates a secret-looking variable
(``$API_KEY``): write a placeholder such as ``<token>`` in samples instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mnemo.memory import threats

_I = re.IGNORECASE
_FETCH = r"(?:curl|wget|fetch|iwr|invoke-webrequest|invoke-restmethod|irm)"
_INTERP = (
    r"(?:sudo\s+(?:-\S+\s+)*)?"
    r"(?:(?:ba|z|k|da|fi)?sh|python[0-9.]*|perl|ruby|node|php|iex|invoke-expression|pwsh|powershell)"
)

_RULES: tuple[tuple[str, str, re.Pattern[str]], ...] = tuple(
    (rule, what, re.compile(rx, flags))
    for rule, what, rx, flags in (
        (
            "pipe_to_shell",
            "pipes a download into a shell or interpreter",
            (
                rf"\b{_FETCH}\b[^\n|]*\|\s*(?:{_INTERP})\b"
                rf"|<\(\s*{_FETCH}\b|\$\(\s*{_FETCH}\b[^\n)]*\)\s*\"?\s*(?:\||$)|\beval\s+\"?\$\(\s*{_FETCH}\b"
                rf"|\b(?:iex|invoke-expression)\b[^\n]*\b(?:{_FETCH}|downloadstring|net\.webclient)\b"
            ),
            _I | re.MULTILINE,
        ),
        (
            "download_and_run",
            "downloads a file and runs it",
            (
                rf"\b{_FETCH}\b[^\n]*(?:\s-o\s*|\s-O\s*|--output[= ]|>\s*)(\S+)[^\n]*(?:&&|;|\n)\s*"
                rf"(?:(?:{_INTERP})\s+\S*|chmod\s+\+?[0-7]*x|\./)"
                r"|\bdownload\s+(?:\S+\s+){0,4}?(?:and|then)\s+(?:run|execute)\b"
            ),
            _I,
        ),
        (
            "credential_access",
            "reads SSH keys or stored credentials",
            (
                r"(?:~|\$HOME|\$\{HOME\}|/home/[^/\s]+|/root)?/\.ssh/\S*|\bid_(?:rsa|dsa|ecdsa|ed25519)\b"
                r"|\.aws/credentials\b|\.git-credentials\b|\bsecurity\s+find-(?:generic|internet)-password\b"
                r"|\bkeychain\s+dump\b|\b(?:cat|read|dump|print|copy|send)\s+(?:\S+\s+){0,3}?"
                r"(?:the\s+)?(?:ssh\s+keys?|private\s+keys?|credentials?\s+(?:file|store)|password\s+store|keyring)\b"
            ),
            _I,
        ),
        (
            "disable_safety",
            "tells the agent to disable its safety rules",
            (
                r"\b(?:disable|turn\s+off|switch\s+off|bypass|skip|ignore|circumvent|deactivate)\s+(?:\S+\s+){0,3}?"
                r"(?:safety|security)\s+(?:rules|checks?|guard(?:s|rails)?|filters?|polic(?:y|ies)|scanners?)\b"
                r"|\b(?:disable|turn\s+off|bypass|circumvent)\s+(?:\S+\s+){0,2}?(?:the\s+)?(?:skill\s+)?"
                r"(?:guard|guardrails|sandbox|threat\s+scan(?:ner)?)\b"
            ),
            _I,
        ),
    )
)

_CHUNK = 30_000  # characters; below threats.MAX_SCAN_BYTES even for 2-byte scripts
_OVERLAP = 1_000


@dataclass(frozen=True, slots=True)
class Refusal:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


def _chunks(text: str) -> list[str]:
    # A supporting file may be longer than the scanner takes at once: scan overlapping
    # windows so that no pattern can straddle a cut unseen.
    if len(text) <= _CHUNK:
        return [text]
    return [text[i : i + _CHUNK] for i in range(0, len(text), _CHUNK - _OVERLAP)]


def check(text: str) -> Refusal | None:
    """The first reason to refuse ``text`` as (part of) a skill, or ``None``."""
    for chunk in _chunks(text):
        threat = threats.scan(chunk)
        if threat is not None:
            return Refusal(str(threat.category), threat.detail)
    for rule, what, pattern in _RULES:
        m = pattern.search(threats.normalize(text))
        if m is not None:
            excerpt = m.group(0).strip()[:80]
            return Refusal(rule, f"{what} ({excerpt!r})")
    return None
