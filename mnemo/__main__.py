"""``python -m mnemo`` behaves exactly like the ``mnemo`` command."""

import sys

from mnemo.cli.main import main

sys.exit(main())
