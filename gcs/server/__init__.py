"""Process wiring: config, start/stop, signals, health + reflection, metrics.  Nothing else."""

from gcs.server.app import GcsServer

__all__ = ["GcsServer"]
