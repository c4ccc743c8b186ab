"""MCP's tables in ``state.db`` (SQL in ``store.py``; the PostgreSQL twin is
``gateway/storage_pg/mcp.py``). One step of the ordered list in ``gateway/storage.py``;
never edit it once shipped, append a new one.

* ``mcp_tokens``: the tokens ``mnemo mcp serve`` accepts, one per client, each bound to
  one person. Only the SHA-256 of a token is stored (a copy of the database gives nobody
  a working token); ``id`` is the short public half people list and revoke.
* ``mcp_catalogs``: every tool list the agent was offered, as fetched from the MCP
  servers at a start or a reload. A session uses the newest one created at or before it
  started, so its tools never change under it (they are part of the cached prompt).
* ``mcp_reloads``: ``mnemo mcp reload`` asks the running processes through this table;
  the first one done writes its report for the command to print.
"""

from __future__ import annotations

from mnemo.memory.migrations import Migration

MCP = Migration(
    "0017_mcp",
    """
CREATE TABLE mcp_tokens (
    id TEXT PRIMARY KEY,               -- public id, shown by `mnemo mcp token list`
    token_hash TEXT NOT NULL UNIQUE,   -- sha256 of the whole token, hex
    user TEXT NOT NULL,                -- PLATFORM:ID the token acts for
    read_only INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,          -- unix time
    expires_at REAL,                   -- NULL: never
    revoked_at REAL,
    last_used_at REAL
);
CREATE TABLE mcp_catalogs (
    version INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at REAL NOT NULL,          -- unix time
    digest TEXT NOT NULL,              -- sha256 of tools
    tools TEXT NOT NULL                -- JSON list of {server, tool, name, description, input_schema}
);
CREATE INDEX mcp_catalogs_created ON mcp_catalogs (created_at);
CREATE TABLE mcp_reloads (
    generation INTEGER PRIMARY KEY AUTOINCREMENT,
    requested_at REAL NOT NULL,
    done_at REAL,
    done_by TEXT,
    report TEXT                        -- JSON: the servers' state after the reload
);
""",
)
