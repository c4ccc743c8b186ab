"""The session_search digest: the auxiliary model summarises what the hits say.

``memory.search.run_session_search_tool`` calls ``summarize`` after a search with hits
when ``search.digest`` is on. The digest is focused on the query and written in the
past tense ("On 3 May the user said …"), so the main model reads a short answer rather
than raw snippets. Any failure raises; the search tool then returns the plain hits.
"""

from __future__ import annotations

from mnemo.gateway.budgets.charge import RequestKind, current_billing, on_behalf_of_turn
from mnemo.gateway.llm.client import LLMClient
from mnemo.memory.ports import SessionStorage
from mnemo.memory.search import SearchResult

DIGEST_MAX_TOKENS = 600
_HITS_CHARS = 12_000

INSTRUCTION = (
    "You are given excerpts from past conversations with this user, found by searching "
    "for: {query!r}.\nSummarise, in the past tense and in at most 6 short bullet points, "
    "only what the excerpts say that is relevant to the search (who said it and when). "
    "If nothing is relevant, answer exactly: nothing relevant found."
)


class LLMSearchDigest:
    def __init__(self, llm: LLMClient, model: str, *, store: SessionStorage | None = None) -> None:
        self.llm = llm
        self.model = model
        self.store = store  # counts the digest's usage against the turn's session and person

    async def summarize(self, query: str, result: SearchResult) -> str:
        lines: list[str] = []
        used = 0
        for session in result.sessions:
            for hit in session.hits:
                who = hit.author_name or hit.role
                line = f"[{hit.created_at:%Y-%m-%d}] {who}: {hit.snippet}"
                if used + len(line) > _HITS_CHARS:
                    break
                lines.append(line)
                used += len(line)
        prompt = INSTRUCTION.format(query=query) + "\n\nExcerpts:\n" + "\n".join(lines)
        response = await self.llm.create(
            system="You summarise search results precisely and briefly.",
            messages=[{"role": "user", "content": prompt}],
            charge=on_behalf_of_turn(RequestKind.DIGEST),
            model=self.model,
            max_tokens=DIGEST_MAX_TOKENS,
            cache=False,
        )
        billing = current_billing()
        if self.store is not None and billing is not None:
            await self.store.add_usage(billing.session_id, response.usage, payer=billing.payer)
        text = response.text.strip()
        if not text:
            raise ValueError("empty digest")
        return text
