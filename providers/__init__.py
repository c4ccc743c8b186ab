"""Memory provider plugins (layer 4), registered through the ``mnemo.memory_providers``
entry-point group exactly like a third-party provider would be."""
