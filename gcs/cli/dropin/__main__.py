"""``python -m gcs.cli.dropin``: the ``gcs-server`` drop-in (what the installed launcher runs)."""

import sys

from gcs.cli.dropin.main import main

sys.exit(main())
