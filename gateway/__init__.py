"""mnemo's runtime: events, lanes, the per-message agent, tools, the LLM client,
background worker, cron, slash commands, configuration and the CLI."""
