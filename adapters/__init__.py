"""One module per platform; each turns platform events into InboundMessage and sends
OutboundMessage back. Adapters never touch memory or the LLM."""
