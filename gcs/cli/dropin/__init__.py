"""Drop-in for Ray 2.60's ``gcs_server`` executable.

Every tool a Ray user runs (``ray start --head``, ``ray.init()``, ``ray.cluster_utils.Cluster``,
KubeRay head pods) starts the wheel's ``ray/core/src/ray/gcs/gcs_server`` with Ray's own command
line.  ``gcs-server`` accepts exactly that command line (:mod:`gcs.cli.dropin.flags`), maps Ray's
``--config_list`` knobs onto our configuration (:mod:`gcs.cli.dropin.ray_config`), and runs our
GCS the way Ray's binary runs (:mod:`gcs.cli.dropin.main`: bind, port file, logs, signals).
``gcs install-into-ray`` (:mod:`gcs.cli.dropin.install`) puts a launcher of it in place of a Ray
install's binary, reversibly.
"""
