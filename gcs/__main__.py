"""``python -m gcs``: the ``gcs`` CLI (used to start child processes with this interpreter)."""

from gcs.cli.main import main

main(prog_name="gcs")
