"""The threat scanner for text that will reach a system prompt.

Curated memory is injected into every future prompt, so it is the most privileged place
an attacker can plant text. Every write to it (and later every skill or context file) is
passed through :func:`scan`, which returns the first :class:`Threat` found or ``None``.

Order of checks, and why:

1. size: more than ``MAX_SCAN_BYTES`` of UTF-8 is refused outright rather than scanned
   partially (a payload past the scanned prefix would slip through);
2. invisible characters, on the *raw* text: NFKC keeps most of them, but checking before
   normalization means no normalization quirk can hide one;
3. the patterns, on NFKC-normalized text with typographic apostrophes folded to ``'``,
   so full-width or compatibility look-alikes (``ｉｇｎｏｒｅ``) match like ASCII.

The patterns are deliberately phrase-shaped (verb + object), not single words, so that
ordinary notes ("Store API keys in env vars", "You are now ready to start") pass. A
regex scan is one layer of defence, not the whole of it: published memory-poisoning
studies get through regex-only filters most of the time. Homoglyphs from other scripts
(Cyrillic ``о`` for Latin ``o``) are not folded by NFKC and are out of scope here.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from enum import StrEnum

MAX_SCAN_BYTES = 64 * 1024

# Zero-width and bidirectional-control characters that let text say one thing to a human
# and another to a model: U+200B-200D, U+2060, U+2062-2064, U+FEFF, U+202A-202E, U+2066-2069.
INVISIBLE_CHARS: frozenset[str] = frozenset(
    chr(cp)
    for cp in (
        *range(0x200B, 0x200E),
        0x2060,
        *range(0x2062, 0x2065),
        0xFEFF,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
)


class ThreatCategory(StrEnum):
    PROMPT_INJECTION = "prompt_injection"
    ROLE_HIJACK = "role_hijack"
    DECEPTION = "deception"
    SYSTEM_OVERRIDE = "system_override"
    BYPASS_RESTRICTIONS = "bypass_restrictions"
    PROMPT_LEAK = "prompt_leak"
    HIDDEN_INSTRUCTIONS = "hidden_instructions"
    EXFILTRATION = "exfiltration"
    SECRET_FILE = "secret_file"
    HARDCODED_SECRET = "hardcoded_secret"
    PERSISTENCE = "persistence"
    INVISIBLE_UNICODE = "invisible_unicode"
    TOO_LONG = "too_long"


@dataclass(frozen=True, slots=True)
class Threat:
    category: ThreatCategory
    detail: str

    def __str__(self) -> str:
        return f"{self.category}: {self.detail}"


_I = re.IGNORECASE
_W = r"(?:\S+\s+)"  # one filler word and the space after it

_SHELL_READERS = (
    r"cat|less|more|head|tail|grep|egrep|source|base64|xxd|od|strings|curl|wget|scp|rsync|cp|tar|zip|nc|type"
)
_READ_VERBS = (
    _SHELL_READERS + r"|read|open|print|show|dump|output|display|upload|send|post|leak|reveal|share|copy|paste"
    r"|exfiltrate|include|attach"
)
_SECRET_FILES = (
    r"(?<![\w.])\.env(?:\.[\w-]+)?\b|\.netrc\b|\.pgpass\b|\.npmrc\b|\.pypirc\b|\.git-credentials\b"
    r"|\.aws/credentials\b|\.docker/config\.json\b|\.kube/config\b|/etc/shadow\b"
    r"|\bid_(?:rsa|dsa|ecdsa|ed25519)\b|\bcredentials\.(?:json|ya?ml|csv|txt|ini|xml)\b"
)
_EDIT_VERBS = r"edit|modify|change|update|overwrite|rewrite|replace|append\s+to|write\s+to|delete|remove|truncate|patch"
_HOME_DIRS = r"(?:~|\$HOME|\$\{HOME\}|/home/[^/\s]+|/root)"
_SECRET_NAMES = (
    r"api[_-]?key|apikey|secret[_-]?key|access[_-]?key(?:[_-]?id)?|private[_-]?key|client[_-]?secret"
    r"|(?:auth|access|refresh|bot|bearer)[_-]?token|token|secret|password|passwd|pwd"
)

# (category, human description, pattern). The first match wins, so the more specific
# categories come before the broader ones that could also match the same text.
_PATTERNS: tuple[tuple[ThreatCategory, str, re.Pattern[str]], ...] = tuple(
    (cat, what, re.compile(rx, flags))
    for cat, what, rx, flags in (
        # --- system override (before injection: "override your system prompt") -------
        (
            ThreatCategory.SYSTEM_OVERRIDE,
            "claims to override the system prompt",
            r"\bsystem\s+prompt\s+override\b"
            r"|\boverride\s+(?:the\s+|your\s+|all\s+)?(?:system\s+(?:prompt|instructions)|safety\s+\w+)"
            r"|\bnew\s+system\s+(?:prompt|instructions)\s*:"
            r"|<\|(?:im_start|im_end|system|endoftext)\|>|</?\s*system\s*>",
            _I,
        ),
        # --- prompt injection --------------------------------------------------------
        (
            ThreatCategory.PROMPT_INJECTION,
            "tells the model to ignore its instructions",
            rf"\b(?:ignore|forget|disregard|override|bypass)\s+{_W}{{0,8}}?"
            rf"(?:previous|all|above|prior|earlier|preceding|system)\s+{_W}{{0,2}}?"
            r"(?:instructions?|prompts?|directives?)\b",
            _I,
        ),
        (
            ThreatCategory.PROMPT_INJECTION,
            "tells the model to ignore its rules",
            rf"\b(?:ignore|forget|disregard)\s+{_W}{{0,8}}?(?:previous|above|prior|earlier|preceding)\s+"
            rf"{_W}{{0,2}}?(?:rules|guidelines)\b",
            _I,
        ),
        (
            ThreatCategory.PROMPT_INJECTION,
            "tells the model to disregard its instructions",
            rf"\bdisregard\s+(?:your|all|any|the|these|those)\s+{_W}{{0,3}}?"
            r"(?:instructions|rules|guidelines|programming|training)\b",
            _I,
        ),
        # --- role hijack -------------------------------------------------------------
        (
            ThreatCategory.ROLE_HIJACK,
            "assigns the model a new identity",
            r"\byou\s+are\s+now\s+(?!(?:ready|able|set|all\s+set|done|finished|connected|logged|signed"
            r"|subscribed|registered|up[\s-]to[\s-]date|running|using|familiar)\b)\w+",
            _I,
        ),
        (
            ThreatCategory.ROLE_HIJACK,
            "asks the model to pretend to be someone else",
            r"\bpretend\s+(?:that\s+)?(?:you\s+are|you're|to\s+be)\b|\bfrom\s+now\s+on,?\s+you\s+are\b",
            _I,
        ),
        # --- deception ---------------------------------------------------------------
        (
            ThreatCategory.DECEPTION,
            "asks the model to hide something from the user",
            r"\b(?:do\s+not|don't|never|must\s+not)\s+(?:tell|inform|notify|let)\s+(?:the\s+)?users?\b(?!\s+to\b)"
            r"|\bwithout\s+(?:telling|informing|notifying)\s+(?:the\s+)?users?\b"
            r"|\b(?:hide|conceal|keep)\s+(?:this|it|that)\s+(?:secret\s+)?from\s+(?:the\s+)?users?\b",
            _I,
        ),
        (
            ThreatCategory.BYPASS_RESTRICTIONS,
            "asks the model to drop its restrictions",
            r"\bact\s+as\s+(?:if|though)\s+you\s+(?:have\s+no|had\s+no|don't\s+have|are\s+not\s+bound\s+by)\s+"
            rf"{_W}{{0,2}}?(?:restrictions|limits|limitations|rules|guidelines|filters)\b"
            rf"|\b(?:respond|answer|reply|operate|act|behave|speak|write)\s+{_W}{{0,4}}?without\s+"
            r"(?:any\s+|your\s+)?(?:(?:safety|content|ethical|moral)\s+)?"
            r"(?:filters?|restrictions|guidelines|guardrails|censorship)\b",
            _I,
        ),
        (
            ThreatCategory.PROMPT_LEAK,
            "asks the model to reveal its system prompt",
            r"\b(?:output|print|reveal|show|repeat|display|leak|dump|share|give\s+me|tell\s+me|send)\s+(?:me\s+)?"
            rf"{_W}{{0,2}}?(?:system\s+prompt|initial\s+instructions|hidden\s+instructions|instructions\s+above)\b",
            _I,
        ),
        (
            ThreatCategory.HIDDEN_INSTRUCTIONS,
            "carries instructions in an HTML comment",
            r"<!--(?:(?!-->).)*?\b(?:ignore|instructions?|system|assistant|you\s+(?:must|should|are|will)|always"
            r"|never|do\s+not|don't|execute|run|send|reveal|pretend|prompt)\b(?:(?!-->).)*-->",
            _I | re.DOTALL,
        ),
        (
            ThreatCategory.HIDDEN_INSTRUCTIONS,
            "contains a hidden HTML element",
            r"<[a-z][^>]*(?:\shidden(?=[\s>=/])|display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0"
            r"|opacity\s*:\s*0(?:\.0*)?(?![.\d])|aria-hidden\s*=\s*[\"']?true)[^>]*>",
            _I,
        ),
        # --- exfiltration ------------------------------------------------------------
        (
            ThreatCategory.EXFILTRATION,
            "sends a secret-looking variable over the network",
            r"\b(?:curl|wget|fetch|invoke-webrequest|iwr|nc|ncat|netcat)\b[^\n]*"
            r"\$\{?\w*(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|API)",
            _I,
        ),
        (
            ThreatCategory.EXFILTRATION,
            "sends data to a URL",
            r"\b(?:send|upload|forward|transmit|exfiltrate|leak|beacon)\b[^\n]{0,200}?\bto\s+<?(?:https?|ftp|wss?)://",
            _I,
        ),
        (
            ThreatCategory.EXFILTRATION,
            "dumps the conversation history",
            rf"\b(?:output|print|dump|reveal|leak|repeat|send|forward|upload|post|paste)\s+{_W}{{0,3}}?"
            r"(?:(?:conversation|chat|message)\s+(?:history|logs?|transcripts?)"
            r"|(?:previous|prior|earlier|past)\s+(?:messages|conversations))\b",
            _I,
        ),
        # --- persistence (before secret files: ~/.ssh/id_rsa is both) ---------------------
        (ThreatCategory.PERSISTENCE, "touches SSH authorized_keys", r"authorized_keys", _I),
        (ThreatCategory.PERSISTENCE, "touches the SSH folder", rf"{_HOME_DIRS}/\.ssh\b", _I),
        (
            ThreatCategory.PERSISTENCE,
            "touches mnemo's own secrets, config or persona",
            r"(?:\.mnemo|\$\{?MNEMO_HOME\}?)/(?:\.env|config\.ya?ml|soul\.md|memories/)",
            _I,
        ),
        (
            ThreatCategory.PERSISTENCE,
            "edits the bot's persona or configuration",
            rf"\b(?:{_EDIT_VERBS})\s+{_W}{{0,4}}?soul\.md\b"
            rf"|\b(?:{_EDIT_VERBS})\s+{_W}{{0,3}}?(?:your|the\s+bot's|mnemo's)\s+(?:own\s+)?"
            r"(?:config(?:uration)?(?:\.ya?ml)?|soul\.md|persona|system\s+prompt)\b",
            _I,
        ),
        (
            ThreatCategory.PERSISTENCE,
            "writes a shell start-up file",
            r"(?:>>?|\btee\s+(?:-a\s+)?)\s*\S*(?:\.bashrc|\.zshrc|\.bash_profile|\.profile|soul\.md)\b",
            _I,
        ),
        # --- secret files --------------------------------------------------------------
        (
            ThreatCategory.SECRET_FILE,
            "reads a secrets file",
            rf"\b(?:{_READ_VERBS})\b[^\n]{{0,80}}?(?:{_SECRET_FILES})",
            _I,
        ),
        (
            ThreatCategory.SECRET_FILE,
            "reads a credentials file",
            rf"\b(?:{_SHELL_READERS})\s+[^\n]{{0,80}}?\bcredentials\b",
            _I,
        ),
        # --- hard-coded secrets --------------------------------------------------------
        (
            ThreatCategory.HARDCODED_SECRET,
            "contains a hard-coded secret",
            rf"(?<![A-Za-z0-9])(?:{_SECRET_NAMES})(?![A-Za-z0-9])[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9+/_\-.=~]{{12,}}"
            r"|\bbearer\s+[A-Za-z0-9._~+/-]{20,}",
            _I,
        ),
        (
            ThreatCategory.HARDCODED_SECRET,
            "contains a token of a known shape",
            r"\bsk-(?:ant-)?[A-Za-z0-9_-]{20,}|\bgh[pousr]_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{30,}"
            r"|\bxox[abposr]-[A-Za-z0-9-]{10,}|\bAKIA[0-9A-Z]{16}\b|\bAIza[0-9A-Za-z_-]{35}"
            r"|-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----|\b\d{8,10}:[A-Za-z0-9_-]{35}\b"
            r"|\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
            r"|\b[MNO][A-Za-z0-9_-]{23,25}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,}",
            0,
        ),
    )
)

# Typographic apostrophes are not folded by NFKC; "don’t" must match like "don't".
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2032": "'"})


def normalize(text: str) -> str:
    """The form the patterns are matched against."""
    return unicodedata.normalize("NFKC", text).translate(_APOSTROPHES)


def _excerpt(match: re.Match[str], width: int = 60) -> str:
    found = " ".join(match.group(0).split())
    return found if len(found) <= width else found[: width - 1] + "…"


def scan(text: str) -> Threat | None:
    """Return the first threat found in ``text``, or ``None`` if it looks safe."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SCAN_BYTES:
        return Threat(ThreatCategory.TOO_LONG, f"{size:,} bytes is more than the {MAX_SCAN_BYTES:,} scanned")
    for ch in text:
        if ch in INVISIBLE_CHARS:
            return Threat(
                ThreatCategory.INVISIBLE_UNICODE,
                f"contains the invisible character U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')})",
            )
    normalized = normalize(text)
    for category, what, pattern in _PATTERNS:
        m = pattern.search(normalized)
        if m is not None:
            return Threat(category, f"{what} ({_excerpt(m)!r})")
    return None
