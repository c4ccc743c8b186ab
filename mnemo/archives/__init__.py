"""``mnemo export``, backups and restores: one archive of a whole profile, the same on
every backend.

The archive is a ``.tar.gz`` (format ``mnemo-profile`` version 2) holding, relative to
``$MNEMO_HOME``:

* ``mnemo-export.json`` — the manifest: format and version, when, which mnemo, the
  source (``backend``: ``sqlite`` or ``postgresql``, and its schema), every table with
  its member and row count, the curated files, every member's sha256, and what was
  left out (secrets);
* ``data/state/<table>.jsonl``, ``data/holographic/<table>.jsonl`` — the rows, one
  JSON object per line (``gateway/archive/format.py`` defines the tables and how each
  kind of value is written), read from one consistent snapshot of the backend;
* ``memories/MEMORY.md``, ``memories/users/PLATFORM/ID/USER.md`` — the curated memory
  (files on SQLite, rows on PostgreSQL: here always files);
* ``skills/``, ``media/``, ``SOUL.md``, ``config.yaml`` (secrets replaced by
  ``secrets.MARKER``, ``database`` left to the target) and the providers' non-secret
  settings and files.

Never in it: ``.env``, ``admin_token``, providers' ``secrets.json``, any value of a
configured secret (replaced by the marker wherever it occurs), lock and SQLite side
files, symbolic links. ``layout.py`` says which members an archive may hold (and
checks a foreign one before anything is written), ``secrets.py`` what is left out,
``export.py`` writes an archive, ``restore.py`` verifies and restores one — also one of
format version 1 (0.1's ``mnemo export``: ``state.db`` and ``facts.db`` as SQLite files).
"""
