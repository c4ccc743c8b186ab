"""A local Anthropic Messages API emulator and its scripted trial model.

Emulator            the aiohttp server (server.py): scripting, faults, recording
Reply / ToolUse     a scripted model answer (script.py)
Fault               a scripted failure: HTTP error, malformed body, mid-stream error
RecordedRequest     what the emulator saw and answered
ManualClock         a hand-advanced clock for prompt-cache TTL tests
PromptCache / Usage prompt-cache accounting (cache.py)
validate_request    the API's request checks as a pure function (validation.py)
trial_reply         the default responder, labelled with TRIAL_LABEL (trial.py)
"""

from mnemo.gateway.emulator.cache import PromptCache, Usage, prefix_blocks
from mnemo.gateway.emulator.script import (
    Fault,
    FaultInjector,
    ManualClock,
    RecordedRequest,
    Reply,
    Responder,
    ScriptItem,
    ToolUse,
    error_body,
)
from mnemo.gateway.emulator.server import Emulator
from mnemo.gateway.emulator.trial import TRIAL_LABEL, fact_to_save, trial_reply
from mnemo.gateway.emulator.validation import MAX_BREAKPOINTS, validate_request

__all__ = [
    "MAX_BREAKPOINTS",
    "TRIAL_LABEL",
    "Emulator",
    "Fault",
    "FaultInjector",
    "ManualClock",
    "PromptCache",
    "RecordedRequest",
    "Reply",
    "Responder",
    "ScriptItem",
    "ToolUse",
    "Usage",
    "error_body",
    "fact_to_save",
    "prefix_blocks",
    "trial_reply",
    "validate_request",
]
