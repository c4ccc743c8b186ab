"""mnemo: a self-hosted chat gateway bot with layered memory.

This package is the composition root: the CLI (``mnemo.cli``) and the application
wiring (``mnemo.app``) live here and are the only code that imports the adapters. The
runtime (``mnemo.gateway``), the platform adapters (``mnemo.adapters``), the memory
layers (``mnemo.memory``) and the memory providers (``mnemo.providers``) are installed
as its sub-packages from the repository's top-level folders.
"""
