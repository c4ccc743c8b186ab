"""Every environment variable mnemo reads is documented in .env.example."""

import re
from pathlib import Path

from mnemo.gateway.config import ENV_KEYS

ROOT = Path(__file__).resolve().parents[2]


def test_env_example_documents_every_variable() -> None:
    text = (ROOT / ".env.example").read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", text, re.M))
    missing = (set(ENV_KEYS) | {"MNEMO_HOME"}) - documented
    assert not missing, f"undocumented: {sorted(missing)}"
