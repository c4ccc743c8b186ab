"""The gateway's repositories on PostgreSQL (``database.url = postgresql://…``).

One module per sub-system, each implementing the same port as its SQLite twin and passing
the same contract suite (``tests/contract/``): ``inbox.py``, ``outbox.py``, ``jobs.py``,
``cron.py``, ``pairings.py``; ``schema.py`` holds their tables and the one ordered
migration list (``PG_MIGRATIONS``). Sessions and search are in ``memory/pg/``.

Several replicas may share one database, so whatever a process claims carries its
``owner`` (``database.replica_id``): start-up recovery only takes back its own claims,
and a claim of another replica is taken over once its lease has expired.
Needs the ``postgres`` extra; imported only by ``gateway/storage.py:open_backend``.
"""
