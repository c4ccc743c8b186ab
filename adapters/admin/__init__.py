"""The admin dashboard at ``/admin`` on the local web server: ``dashboard.py`` (pages
and routes), ``auth.py`` (sign-in, sessions, CSRF), ``ports.py`` (what the composition
root hands it)."""
