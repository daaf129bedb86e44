"""Virtual-cluster admin SDK: async ``VirtualClusterClient`` and sync one-shot calls.

The implementation lives in :mod:`gcs.sdk._vcluster_client`; this is its public name.
"""

from gcs.sdk._vcluster_client import (
    Applied,
    VirtualClusterCallError,
    VirtualClusterClient,
    create_or_update,
    get,
    list_clusters,
    remove,
    show,
)

__all__ = [
    "Applied",
    "VirtualClusterCallError",
    "VirtualClusterClient",
    "create_or_update",
    "get",
    "list_clusters",
    "remove",
    "show",
]
