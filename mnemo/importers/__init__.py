"""Moving in from another agent: ``mnemo import --from hermes|openclaw PATH``.

Each source module (``hermes.py``, ``openclaw.py``) only *reads* the other agent's
files and turns them into a :class:`~mnemo.importers.common.Bundle` — memory entries,
a profile, a persona, skill folders and sessions with their messages. ``apply.py``
writes a bundle into a mnemo profile through mnemo's own write paths (the curated
files with their limits and threat scan, the skill store with its guard, the session
store), so nothing imported skips a check a conversation would pass. ``chats.py``
decides which mnemo chat a foreign conversation lands in.

A second import of the same source changes nothing: sessions get ids derived from the
source's own session ids, messages carry the source's message ids, memory entries and
skills already present are recognised as such.
"""
