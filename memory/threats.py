"""The threat scanner for text that will reach a system prompt.

Curated memory is injected into every future prompt, so it is the most privileged place
an attacker can plant text. Every durable write the model can make goes through
:func:`scan` — curated memory (``memory/curated.py``), holographic facts (their store),
and the tool arguments an external provider declares durable (``ToolSchema.durable_args``,
checked by the manager); skills and context files must use it too, through
:func:`guard_write` (which raises ``MemoryRefused``) or :func:`scan`. It returns the
first :class:`Threat` found or ``None``.

Order of checks, and why:

1. size: more than ``MAX_SCAN_BYTES`` of UTF-8 is refused outright rather than scanned
   partially (a payload past the scanned prefix would slip through);
2. characters, on the *raw* text (checking before normalization means no normalization
   quirk can hide one):

   * ``invalid_text``: a lone surrogate (undecodable bytes smuggled in through
     surrogateescape, or ``"\\ud800"`` in JSON) cannot be stored as UTF-8;
   * ``control_character``: C0 controls except tab and newline (CR only as part of
     CRLF), DEL and the C1 controls. ESC starts terminal escape sequences (``\\e[8m``
     hides text from the operator reading ``mnemo memory show``), NUL truncates text in
     C-based tools;
   * ``invisible_unicode``: every format character (category Cf: zero-width and bidi
     controls including LRM/RLM, soft hyphen, U+180E, U+2061-2064, U+FFF9-FFFB, the TAG
     block U+E0000-E007F that spells hidden ASCII, ...) except the few *visible* ones
     (the Arabic/Syriac number signs such as U+0600-0605), plus the invisible fillers
     U+034F, U+115F, U+1160, U+3164, U+FFA0 and the Mongolian selectors. Variation
     selectors (U+FE00-FE0F, U+E0100-E01EF) are allowed one at a time right after a
     visible character, which is how emoji (``❤️``) and ideographic variants use them;
     a run of two or more, or one after a space or at the start, is refused: that is
     how bytes are smuggled in variation selectors;
3. the patterns, on NFKC-normalized text with typographic apostrophes folded to ``'``,
   so full-width or compatibility look-alikes (``ｉｇｎｏｒｅ``) match like ASCII. The
   instruction-shaped patterns (injection, override, role hijack, deception, bypass,
   prompt leak, future instructions) are also matched against de-obfuscated copies:
   runs of single letters joined (``I-g-n-o-r-e``, ``i g n o r e``), common leetspeak
   mapped inside words that mix letters and digits or symbols (``1gn0re``, ``@ll``),
   and, for the core "ignore previous instructions" phrase, the text squashed to
   letters only (``i g n o r e a l l p r i o r ...``). The copies are only matched,
   never stored, and only by those patterns (a digit in a token or path stays a digit
   for the secret patterns).

Future instructions — where the line is: text aimed at the assistant's behaviour in
later turns ("from now on", "in all future conversations", "always", "every reply",
"going forward", ...) is refused when the same sentence tells the assistant to disclose
a secret (reply with / include / send / reveal ... a password, API key, credentials, an
access token, a private key, the system prompt) or to drop its own rules (ignore /
bypass / override your rules, safety guidelines, the system prompt; obey someone else).
A plain preference passes ("From now on the user wants answers in French", "Always
store API keys in env vars"), and so does a prohibition ("from now on never share the
admin password").

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

from mnemo.memory.errors import MemoryRefused

MAX_SCAN_BYTES = 64 * 1024

# Format characters (Cf) that render as a visible sign: the prepended concatenation marks.
_VISIBLE_FORMAT: frozenset[str] = frozenset(
    chr(cp) for cp in (*range(0x0600, 0x0606), 0x06DD, 0x070F, 0x0890, 0x0891, 0x08E2, 0x110BD, 0x110CD)
)
# Invisible characters outside Cf: the combining grapheme joiner, the Hangul fillers and
# the Mongolian free variation selectors.
_INVISIBLE_OTHER: frozenset[str] = frozenset(
    chr(cp) for cp in (0x034F, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x180B, 0x180C, 0x180D, 0x180F)
)
_C0_NAMES = (
    "NUL SOH STX ETX EOT ENQ ACK BEL BS HT LF VT FF CR SO SI "
    "DLE DC1 DC2 DC3 DC4 NAK SYN ETB CAN EM SUB ESC FS GS RS US"
).split()


def is_variation_selector(ch: str) -> bool:
    cp = ord(ch)
    return 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF


def is_invisible(ch: str) -> bool:
    """A character that hides text: format characters (Cf) but the visible few, and the
    invisible fillers. Variation selectors are judged in context by :func:`scan`."""
    return (unicodedata.category(ch) == "Cf" and ch not in _VISIBLE_FORMAT) or ch in _INVISIBLE_OTHER


def is_control(ch: str) -> bool:
    """C0 except tab and newline, DEL, C1. (CR is allowed by :func:`scan` only before LF.)"""
    cp = ord(ch)
    return (cp < 0x20 and ch not in "\t\n") or 0x7F <= cp <= 0x9F


def control_name(ch: str) -> str:
    cp = ord(ch)
    if cp < 0x20:
        return _C0_NAMES[cp]
    return "DEL" if cp == 0x7F else "a C1 control"


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
    FUTURE_INSTRUCTION = "future_instruction"
    INVISIBLE_UNICODE = "invisible_unicode"
    CONTROL_CHARACTER = "control_character"
    INVALID_TEXT = "invalid_text"
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
    _SHELL_READERS
    + r"|read|open|print|show|dump|output|display|upload|send|post|leak|reveal|share|copy|paste"
    r"|exfiltrate|include|attach"
)
_SECRET_FILES = (
    r"(?<![\w.])\.env(?:\.[\w-]+)?\b|\.netrc\b|\.pgpass\b|\.npmrc\b|\.pypirc\b|\.git-credentials\b"
    r"|\.aws/credentials\b|\.docker/config\.json\b|\.kube/config\b|/etc/shadow\b"
    r"|\bid_(?:rsa|dsa|ecdsa|ed25519)\b|\bcredentials\.(?:json|ya?ml|csv|txt|ini|xml)\b"
)
_EDIT_VERBS = (
    r"edit|modify|change|update|overwrite|rewrite|replace|append\s+to|write\s+to|delete|remove|truncate|patch"
)
_HOME_DIRS = r"(?:~|\$HOME|\$\{HOME\}|/home/[^/\s]+|/root)"
_SECRET_NAMES = (
    r"api[_-]?key|apikey|secret[_-]?key|access[_-]?key(?:[_-]?id)?|private[_-]?key|client[_-]?secret"
    r"|(?:auth|access|refresh|bot|bearer)[_-]?token|token|secret|password|passwd|pwd"
)

# Future instructions: a marker of later turns, then (same sentence, no negation in
# between) a disclosure of a secret or the dropping of the assistant's own rules.
_FUTURE = (
    r"(?:\bfrom\s+now\s+on\b|\bfrom\s+(?:this|that|here)\s+(?:point|moment|day|time)?\s*(?:on|forward|onwards?)\b"
    r"|\b(?:going|moving)\s+forward\b|\bhenceforth\b|\bhereafter\b|\bfrom\s+here\s+on\b"
    r"|\b(?:in|for|during|on)\s+(?:all\s+|any\s+|every\s+|each\s+)?(?:the\s+)?(?:future|later|subsequent|upcoming"
    r"|following|next|coming)\s+(?:conversations?|sessions?|chats?|turns?|replies|responses|answers|messages"
    r"|interactions|requests)\b"
    r"|\b(?:in|for|on)\s+(?:all|every|each)\s+(?:conversations?|sessions?|chats?|turns?|replies|responses|answers"
    r"|messages|interactions)\b|\bevery\s+(?:reply|response|answer|message|turn|conversation|session)\b"
    r"|\b(?:each|every)\s+time\b|\bwhenever\b|\balways\b|\bforever\b|\bpermanently\b|\bfrom\s+today\b)"
)
_NO_NEGATION = r"(?:(?!\b(?:never|not|no|don't|doesn't|won't|shouldn't|mustn't|cannot|can't)\b)[^.!?\n])"
_SECRET_THING = (
    r"(?:passwords?|passphrases?|passwd|credentials?|secrets?|api[\s_-]?keys?|secret[\s_-]?keys?"
    r"|(?:access|auth|bearer|bot|refresh|session|api|oauth)[\s_-]?tokens?|private[\s_-]?keys?|ssh[\s_-]?keys?"
    r"|2fa(?:\s+codes?)?|otp|one[\s-]time\s+(?:codes?|passwords?)|pin(?:\s+codes?)?|recovery\s+codes?"
    r"|seed\s+phrases?|(?<![\w.])\.env\b|environment\s+variables|system\s+prompt|hidden\s+instructions"
    r"|initial\s+instructions)\b"
)
_DISCLOSE = (
    r"(?:(?:reply|respond|answer|start|end|begin|sign|open|close)\s+(?:\S+\s+){0,3}?with|include|reveal|disclose"
    r"|share|send|give|tell|print|output|show|leak|append|attach|mention|repeat|provide|post|paste|e-?mail|forward"
    r"|expose|hand\s+over|read\s+out|spell\s+out)\b"
)
_RULES = (
    r"(?:(?:your|its|the\s+assistant's|the\s+bot's|all\s+(?:of\s+)?(?:your|the|previous|prior|safety)"
    r"|any\s+(?:of\s+)?(?:your|the|safety)|the\s+(?:above|previous|system|safety|original)|previous|prior"
    r"|earlier|original|safety|security|ethical|content|system)\s+(?:\S+\s+){0,2}?"
    r"(?:rules|instructions|guidelines|restrictions|filters?|guardrails|polic(?:y|ies)|principles|limits|limitations"
    r"|prompt|programming|training)\b|\bsafety\b|\bguardrails\b|\bsystem\s+prompt\b|\bcontent\s+polic(?:y|ies)\b)"
)
_DROP = (
    r"(?:ignore|disregard|bypass|override|forget|skip|disable|turn\s+off|circumvent|break|violate|drop|abandon"
    r"|suspend|deactivate|switch\s+off)\b"
)
_FUTURE_ACT = (
    rf"(?:\b{_DISCLOSE}{_NO_NEGATION}{{0,80}}?{_SECRET_THING}"
    rf"|\b{_DROP}\s+(?:\S+\s+){{0,3}}?{_RULES}"
    r"|\bobey\s+(?:only\s+)?(?:me|them|him|her|this\s+(?:note|message|user)|these\s+instructions|whoever|anyone"
    r"|the\s+(?:next|last|following)|instructions\s+(?:in|from)))"
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
            "tells the model to ignore what it was told",
            r"\b(?:ignore|forget|disregard|override|bypass|discard|set\s+aside|pay\s+no\s+attention\s+to"
            r"|throw\s+(?:away|out))\s+(?:(?:all|any|every|each|of|the|your|these|those)\s+){0,3}"
            r"(?:(?:instructions?|prompts?|directives?|rules|guidelines|commands|guidance|orders)\s+"
            r"(?:above|before\s+this|so\s+far|(?:you\s+(?:were|have\s+been|got)\s+)?(?:given|told)\b"
            r"|(?:that\s+)?you\s+(?:were|have\s+been)\s+(?:given|told))"
            r"|(?:everything|anything|all|what)\s+(?:you(?:'ve|\s+have|\s+were|\s+have\s+been)\s+"
            r"(?:told|instructed|given|taught)|(?:above|before\s+this|said\s+(?:above|before)))"
            r"|(?:previous|prior|earlier|preceding|above|former|original|initial)\s+(?:\S+\s+){0,2}?"
            r"(?:commands|guidance|orders|programming|training|directions|system\s+message))\b",
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
            ThreatCategory.FUTURE_INSTRUCTION,
            "tells the model to disclose a secret or drop its rules in later turns",
            rf"{_FUTURE}{_NO_NEGATION}{{0,150}}?{_FUTURE_ACT}"
            rf"|{_FUTURE_ACT}[^.!?\n]{{0,120}}?{_FUTURE}",
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


# Patterns that describe instructions; only these are matched against the
# de-obfuscated copies (see the module docstring).
_INSTRUCTION_CATEGORIES = frozenset(
    {
        ThreatCategory.SYSTEM_OVERRIDE,
        ThreatCategory.PROMPT_INJECTION,
        ThreatCategory.ROLE_HIJACK,
        ThreatCategory.DECEPTION,
        ThreatCategory.BYPASS_RESTRICTIONS,
        ThreatCategory.PROMPT_LEAK,
        ThreatCategory.FUTURE_INSTRUCTION,
    }
)
# Three or more single letters or digits with the same separator between each:
# "I-g-n-o-r-e", "i g n o r e", "i.g.n.o.r.e", "i _ g _ n".
_LETTER_RUN = re.compile(
    r"(?<![^\W_])[^\W_](?P<sep>\s*[-_.*·•|+~/\\:=]\s*|\s)(?:[^\W_](?P=sep))+[^\W_](?![^\W_])"
)
_LEET = {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "9": "g",
         "@": "a", "$": "s", "!": "i", "|": "l", "+": "t"}  # fmt: skip
_LEET_I = str.maketrans(_LEET)
_LEET_L = str.maketrans({**_LEET, "1": "l"})
_LEET_TOKEN = re.compile(r"[\w@$!|+]+")  # whole tokens: linear, no backtracking over a long word
# The core injection phrase with every word boundary gone (for fully spaced-out text).
_SQUASHED_INJECTION = re.compile(
    r"(?:ignore|disregard|forget|bypass|override)(?:all|any|the|your|every|of)*"
    r"(?:previous|prior|above|earlier|preceding|former|system)(?:instructions?|prompts?|rules|directives?|commands"
    r"|guidelines)"
)


def _join_letter_runs(text: str) -> str:
    return _LETTER_RUN.sub(lambda m: "".join(ch for ch in m.group(0) if ch.isalnum()), text)


def _unleet(text: str, table: dict[int, str]) -> str:
    def word(m: re.Match[str]) -> str:
        token = m.group(0)
        if not any(ch.isalpha() for ch in token) or not any(ch in _LEET for ch in token):
            return token  # a number stays a number, a plain word stays as it is
        if table is _LEET_I:
            token = token.replace("11", "ll")  # "a11" is "all"; a single 1 is an i
        return token.translate(table)

    return _LEET_TOKEN.sub(word, text)


def deobfuscated(normalized: str) -> tuple[str, ...]:
    """The copies of normalized text the instruction patterns also look at."""
    joined = _join_letter_runs(normalized)
    copies = dict.fromkeys((joined, _unleet(joined, _LEET_I), _unleet(joined, _LEET_L)))
    copies.pop(normalized, None)
    return tuple(copies)


def _character_threat(text: str) -> Threat | None:
    previous = ""
    for i, ch in enumerate(text):
        cp = ord(ch)
        if 0xD800 <= cp <= 0xDFFF:
            return Threat(
                ThreatCategory.INVALID_TEXT,
                f"contains the lone surrogate U+{cp:04X} (undecodable input, not valid Unicode text)",
            )
        if is_control(ch) and not (ch == "\r" and text[i + 1 : i + 2] == "\n"):
            return Threat(
                ThreatCategory.CONTROL_CHARACTER,
                f"contains the control character U+{cp:04X} ({control_name(ch)}); terminal escape sequences "
                "and control characters are not allowed in stored text",
            )
        if is_variation_selector(ch):
            if (
                not previous
                or previous.isspace()
                or is_variation_selector(previous)
                or is_invisible(previous)
            ):
                return Threat(
                    ThreatCategory.INVISIBLE_UNICODE,
                    f"contains the variation selector U+{cp:04X} where it selects nothing "
                    "(runs of variation selectors can smuggle hidden bytes)",
                )
        elif is_invisible(ch):
            return Threat(
                ThreatCategory.INVISIBLE_UNICODE,
                f"contains the invisible character U+{cp:04X} ({unicodedata.name(ch, 'unnamed')})",
            )
        previous = ch
    return None


def scan(text: str) -> Threat | None:
    """Return the first threat found in ``text``, or ``None`` if it looks safe."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_SCAN_BYTES:
        return Threat(ThreatCategory.TOO_LONG, f"{size:,} bytes is more than the {MAX_SCAN_BYTES:,} scanned")
    threat = _character_threat(text)
    if threat is not None:
        return threat
    normalized = normalize(text)
    copies: tuple[str, ...] | None = None
    for category, what, pattern in _PATTERNS:
        m = pattern.search(normalized)
        if m is None and category in _INSTRUCTION_CATEGORIES:
            if copies is None:
                copies = deobfuscated(normalized)
            m = next((found for c in copies if (found := pattern.search(c)) is not None), None)
        if m is not None:
            return Threat(category, f"{what} ({_excerpt(m)!r})")
    for copy in (normalized, *(copies or ())):
        squashed = "".join(ch for ch in copy.lower() if ch.isalpha())
        m = _SQUASHED_INJECTION.search(squashed)
        if m is not None:
            return Threat(
                ThreatCategory.PROMPT_INJECTION,
                f"tells the model to ignore its instructions ({_excerpt(m)!r})",
            )
    return None


def guard_write(text: str, what: str = "the text") -> None:
    """Refuse a durable write: raise ``MemoryRefused`` naming the threat's category.

    The one gate for every store the model can write to that is not curated memory
    (which reports the category in its own result): facts, external providers' durable
    tool arguments, and later skills.
    """
    threat = scan(text)
    if threat is not None:
        raise MemoryRefused(
            f"Blocked ({threat.category}): {what} {threat.detail}. Stored text reaches future prompts, so it must "
            "not carry injection, exfiltration or hidden payloads. Nothing was saved."
        )
