"""Property tests: random add/replace/remove sequences against an independent model of the
store's rules. After every step the file on disk is exactly the model's entries joined by
the delimiter, parses back to them, and never exceeds the limit."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mnemo.memory.curated import ENTRY_DELIMITER, MemoryFiles, parse_entries
from mnemo.memory.threats import scan

LIMIT = 60

# A small alphabet so that substrings collide and separators appear; now and then a
# zero-width space, which the threat scan refuses.
_clean = st.text(alphabet=st.sampled_from(list("aabbc  §\n\r\té")), max_size=24)
texts = st.one_of(_clean, _clean, _clean, st.builds(lambda a, b: a + "\u200b" + b, _clean, _clean))


def joined_len(entries: tuple[str, ...]) -> int:
    return len(ENTRY_DELIMITER.join(entries))


def stored_form(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


def valid_content(text: str) -> str | None:
    entry = stored_form(text)
    if not entry or any(line.strip() == "§" for line in entry.split("\n")) or scan(entry) is not None:
        return None
    return entry


def target_index(entries: tuple[str, ...], old_text: str) -> int | None:
    old = stored_form(old_text)
    if not old:
        return None
    if old in entries:
        return entries.index(old)
    hits = [i for i, e in enumerate(entries) if old in e]
    return hits[0] if len(hits) == 1 else None


class CuratedFileMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="mnemo-prop-"))
        self.file = MemoryFiles(self.dir, memory_limit=LIMIT).shared()
        self.model: tuple[str, ...] = ()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def old_text(self, data: st.DataObject) -> str:
        if self.model and data.draw(st.booleans()):
            entry = data.draw(st.sampled_from(self.model))
            i = data.draw(st.integers(0, len(entry) - 1))
            j = data.draw(st.integers(i + 1, len(entry)))
            return entry[i:j]
        return data.draw(texts)

    @rule(content=texts)
    def add(self, content: str) -> None:
        result = self.file.add(content)
        entry = valid_content(content)
        if entry is None:
            assert not result.success
        elif entry in self.model:
            assert result.success and not result.changed
        elif joined_len((*self.model, entry)) <= LIMIT:
            assert result.success and result.changed
            self.model = (*self.model, entry)
        else:
            event("add refused: over the limit")
            assert not result.success and result.entries is not None

    @rule(data=st.data())
    def replace(self, data: st.DataObject) -> None:
        old = self.old_text(data)
        # Sometimes the new text equals another entry: the two must merge into one.
        content = data.draw(st.sampled_from(self.model) if self.model and data.draw(st.booleans()) else texts)
        result = self.file.replace(old, content)
        entry, idx = valid_content(content), target_index(self.model, old)
        if entry is None or idx is None:
            event("replace refused: bad content or no unique match")
            assert not result.success
            return
        if self.model[idx] == entry:
            event("replace with the same text")
            assert result.success and not result.changed
            return
        new = parse_entries(ENTRY_DELIMITER.join((*self.model[:idx], entry, *self.model[idx + 1 :])))
        if joined_len(new) > LIMIT and joined_len(new) > joined_len(self.model):
            event("replace refused: over the limit")
            assert not result.success
            return
        if len(new) < len(self.model):
            event("replace merged two entries")
        assert result.success and result.old_entry == self.model[idx]
        self.model = new

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        old = self.old_text(data)
        result = self.file.remove(old)
        idx = target_index(self.model, old)
        if idx is None:
            assert not result.success
            return
        event("remove succeeded")
        assert result.success and result.old_entry == self.model[idx]
        self.model = (*self.model[:idx], *self.model[idx + 1 :])

    @invariant()
    def disk_is_exactly_the_model(self) -> None:
        path = self.file.path
        text = path.read_bytes().decode("utf-8") if path.exists() else ""
        assert text == ENTRY_DELIMITER.join(self.model)
        assert parse_entries(text) == self.model
        assert len(text) <= LIMIT
        snap = self.file.load()
        assert snap.entries == self.model and snap.chars <= LIMIT


CuratedFileMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_random_operation_sequences_keep_disk_and_model_equal = CuratedFileMachine.TestCase


@given(st.lists(texts, max_size=12))
def test_join_then_parse_round_trips_valid_entries(raw: list[str]) -> None:
    entries = tuple(dict.fromkeys(e for e in (valid_content(t) for t in raw) if e is not None))
    assert parse_entries(ENTRY_DELIMITER.join(entries)) == entries
    assert parse_entries("\ufeff" + ENTRY_DELIMITER.join(entries)) == entries
