"""Token use and cost of LLM requests: the one ``Usage`` type of mnemo.

The LLM client fills it from the API's usage fields (``input_tokens`` counts only what
follows the last cache breakpoint; cache reads and writes are counted apart) and the
price table; the session store accumulates it per session; reports add it up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            self.cost_usd + other.cost_usd,
        )

    @property
    def prompt_tokens(self) -> int:
        """Everything the model read: input counts only what follows the last breakpoint."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
