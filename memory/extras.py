"""How to install an optional extra (``mnemo[postgres]``, ``mnemo[mem0]``, …).

Messages say ``<this interpreter> -m pip install 'mnemo[x]'``: the extra must go into
the environment mnemo runs from, and a bare ``pip install 'mnemo[x]'`` outside that
virtualenv would install an unrelated ``mnemo`` package from the registry.
"""

from __future__ import annotations

import shlex
import sys


def install_hint(extra: str) -> str:
    return f"{shlex.quote(sys.executable)} -m pip install 'mnemo[{extra}]'"
