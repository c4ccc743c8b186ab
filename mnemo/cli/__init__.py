"""The ``mnemo`` command line. Each module here that defines ``register(subparsers)``
adds one command (group); ``main`` discovers them, so adding a command touches one file."""
