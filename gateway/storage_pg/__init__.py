"""The gateway's repositories on PostgreSQL (``database.url = postgresql://…``).

One module per sub-system, each implementing the same port as its SQLite twin and passing
the same contract suite (``tests/contract/``): ``inbox.py``, ``outbox.py``, ``jobs.py``,
``cron.py``, ``pairings.py``, ``budgets.py``, ``links.py``, ``rate_limits.py``,
``streams.py``, the people directory (``people.py``) and a person's data for erasure
(``erasure.py``); ``schema.py`` holds their tables and the one ordered migration list
(``PG_MIGRATIONS``); ``gateway/storage_postgresql.py`` opens them all as one
``StorageBackend``. Sessions,
search and the curated memory rows are in ``memory/pg/``.

Several replicas may share one database, so whatever a process claims carries its
``owner`` (``database.replica_id``): start-up recovery only takes back its own claims,
and a claim of another replica is taken over once its lease has expired.
Needs the ``postgres`` extra; opened through ``gateway/storage.py:backend_for`` (``mnemo
migrate`` reads ``schema.py`` too). Nothing here imports the storage modules above it.
"""
