"""MCP both ways, through the official ``mcp`` SDK (the ``mnemo[mcp]`` extra).

* The servers the agent uses (``mcp.servers``): ``connection.py`` (one server, SDK
  errors mapped), ``catalog.py`` (the tools offered, frozen per session), ``results.py``
  (what a tool returned: bounded, scanned, fenced), ``hub.py`` (all servers: a tool
  source for the turns, reloads, health), ``command.py`` (``/mcp``).
* mnemo's memory as a server (``mnemo mcp serve``): ``tokens.py`` (a client bound to one
  person), ``person.py`` (that person's memory through the bot's code paths),
  ``server.py`` (stdio and HTTP).
* ``store.py``/``schema.py``: tokens, catalogs and reload requests on ``state.db``
  (``gateway/storage_pg/mcp.py`` on PostgreSQL).
"""
