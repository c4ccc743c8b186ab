"""mnemo: a self-hosted chat gateway bot with layered memory.

This package is the composition root: the CLI (``mnemo.cli``) and the application
wiring (``mnemo.app``) live here and are the only code that imports the adapters. The
runtime (``mnemo.gateway``), the platform adapters (``mnemo.adapters``), the memory
layers (``mnemo.memory``) and the memory providers (``mnemo.providers``) are installed
as its sub-packages from the repository's top-level folders.
"""

# The one place the version is written: pyproject.toml reads it (setuptools dynamic
# version) and ``mnemo --version`` prints it. CHANGELOG.md says what each one changed.
__version__ = "0.2.0"
