"""Archives: a profile's data in one backend-neutral form (``mnemo export``, backups).

``format.py`` defines the form — which tables an archive holds, each column's kind and
how a value is written as JSON — and reads and writes it as JSON lines in a folder.
``ports.py`` is what a storage backend offers for it: a consistent ``Snapshot`` of its
data and a loader that restores one (``ArchiveStore``); ``sqlite.py`` is SQLite's
(``storage_pg/archive.py`` PostgreSQL's). The tar around it, the manifest, the files of
the profile and the secrets left out are the composition root's (``mnemo/archives``).
"""
