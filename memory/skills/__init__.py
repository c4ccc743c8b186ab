"""Procedural memory: skills, the "how to do it" documents the agent reads on demand.

* :mod:`.format` — the SKILL.md format (YAML front matter) and path rules;
* :mod:`.guard` — the memory threat scanner plus the skill-specific rules;
* :mod:`.store` — shared and per-user skill folders, atomic writes, history.
"""

from mnemo.memory.skills.format import SkillExists, SkillMeta, SkillRefused, parse_skill
from mnemo.memory.skills.store import Skill, SkillStore

__all__ = ["Skill", "SkillExists", "SkillMeta", "SkillRefused", "SkillStore", "parse_skill"]
