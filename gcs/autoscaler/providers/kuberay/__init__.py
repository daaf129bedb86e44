"""KubeRay provider: the RayCluster custom resource is the cloud (Ray 2.60 §2.7, §3).

- :mod:`.k8s` — the Kubernetes API calls (the only I/O), on the official client;
- :mod:`.cluster` — RayCluster -> autoscaling config (pure);
- :mod:`.ippr` — ``ray.io/ippr`` parsing and validation, per-pod resize state (pure);
- :mod:`.downsize` — when idle extra capacity is given back (pure, beyond Ray);
- :mod:`.provider` — the provider: lists pods, scales the RayCluster, carries out resizes.
"""
