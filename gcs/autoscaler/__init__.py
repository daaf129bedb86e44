"""The autoscaler (Ray autoscaler v2's design): a pure scheduler, an instance manager, a
reconciler that observes then acts, and cloud providers behind one contract.

Its pure parts -- the value types (``model``), the bin-packing ``scheduler`` and the
unavailable-capacity cache (``capacity``) -- are policy, in :mod:`gcs.policy.autoscaling`; its
command lines (``gcs autoscaler ...``) are entry points, in :mod:`gcs.cli.autoscaler` and
:mod:`gcs.cli.autoscaler_run`.  What is here, lowest first; a module imports only from its own
layer or the ones before it (``tests/autoscaler/test_layers.py`` checks it):

0. ``providers.registry`` (one row per provider type naming where its factory, config
   section parser and cloud config reader live; it imports nothing, so every layer reads it
   and adding a provider is one module plus one row);
1. ``config`` (cluster YAML; Ray's launcher keys in ``launcher_yaml``, the resources a
   provider's cloud describes in ``node_resources``), ``cluster_state``
   (ClusterResourceState -> scheduler input);
2. ``instances`` -- instance records, their lifecycle table, versioned storage, one lane;
3. ``gcs_api`` (what the autoscaler asks of a GCS), ``grpc_gcs`` (that, over gRPC);
4. ``providers`` -- the cloud behind one contract (``providers.base``), each provider
   building what only it needs (KubeRay its API client) from its own config section;
5. ``reconciler`` -- one round: observe, decide (scheduler), act (instances, providers);
6. ``runtime`` (the reconciler in a loop: the component embedded in ``gcs serve`` and the
   standalone autoscaler), ``metrics``, ``simulator`` (a simulated cloud on a virtual clock);
7. ``planner`` -- what ``gcs autoscaler plan`` prints.

Outside the package it uses ``gcs.base`` (clock, errors, auth, protowire), ``gcs.policy``,
``gcs.proto``, ``gcs.rpc`` (the client side) and ``gcs.store``; never ``gcs.server``,
``gcs.managers`` or ``gcs.services``.
"""
