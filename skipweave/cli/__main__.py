"""``python -m skipweave.cli`` = the ``skipweave`` command."""

import sys

from skipweave.cli.main import main

sys.exit(main())
