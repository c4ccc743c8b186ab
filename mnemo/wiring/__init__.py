"""The composition root's builders: one module per sub-system.

``open_app`` (``mnemo/app.py``) calls them in start-up order and enters what each
starts into its one ``AsyncExitStack``. A builder takes the settings and the parts it
depends on and returns what it built; it holds no business rule (those live in the
sub-system that owns them — e.g. which provider tools count as failures lives in
``gateway/turns/providers.py``), so reading a builder tells you how the parts connect and
nothing else.
"""
