"""gcs: a Ray-wire-compatible control plane (GCS) with virtual clusters and an autoscaler."""

__version__ = "0.1.0"
RAY_VERSION = "2.60.0"
"""The Ray version whose wire protocol we speak (reported by CheckAlive)."""
