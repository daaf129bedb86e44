"""Every command line: ``gcs`` (:mod:`gcs.cli.main`) and its groups, and
``gcs-server`` (:mod:`gcs.cli.dropin`, Ray's gcs_server command line)."""
