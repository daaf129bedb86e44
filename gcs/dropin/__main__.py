"""``python -m gcs.dropin``: the ``gcs-server`` drop-in (what the installed launcher runs)."""

import sys

from gcs.dropin.main import main

sys.exit(main())
