"""Layer 2 on PostgreSQL: the connection pool and migration runner (``db.py``), memory's
own tables (``schema.py``), sessions and messages (``sessions.py``) and session_search on
PostgreSQL full-text search (``search.py``).

Everything here needs the optional extra (``pip install 'mnemo[postgres]'``: psycopg 3 and
psycopg_pool); nothing imports this package unless ``database.url`` names a PostgreSQL
server, so the SQLite default never loads psycopg.
"""
