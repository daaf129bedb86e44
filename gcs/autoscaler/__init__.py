"""The autoscaler (Ray autoscaler v2's design): a pure scheduler, an instance manager, a
reconciler that observes then acts, and cloud providers behind one contract.

Layers, lowest first.  A module imports only from its own layer or the ones before it
(``tests/autoscaler/test_layers.py`` checks it):

0. ``model`` (statuses, node kinds, Ray nodes as observed), ``deadline`` (time limits on
   the injected clock), ``providers.registry`` (one row per provider type naming where its
   factory, config section parser and cloud config reader live; it imports nothing, so
   every layer reads it and adding a provider is one module plus one row);
1. ``scheduler`` -- the pure policy: config + snapshot + instances -> decisions with reasons
   (``scheduler.types``, its values, at the bottom; ``core.schedule`` the steps in order);
2. ``config`` (cluster YAML), ``cluster_state`` (ClusterResourceState -> scheduler input);
3. ``instances`` -- instance records, their lifecycle table, versioned storage, one lane;
4. ``gcs_api`` (what the autoscaler asks of a GCS), ``grpc_gcs`` (that, over gRPC);
5. ``providers`` -- the cloud behind one contract (``providers.base``), each provider
   building what only it needs (KubeRay its API client) from its own config section;
6. ``reconciler`` -- one round: observe, decide (scheduler), act (instances, providers);
7. ``runtime`` (the reconciler in a loop: the component embedded in ``gcs serve`` and the
   standalone autoscaler), ``metrics``, ``simulator`` (a simulated cloud on a virtual clock);
8. ``planner``, ``cli``, ``run_cli`` -- the command line.

Outside the package it uses ``gcs.base.clock``, ``gcs.base.errors``, ``gcs.proto``, ``gcs.rpc`` (the
client side), ``gcs.store``, ``gcs.base.auth``, ``gcs.cli_*`` (command line only),
``gcs.policy.virtual_clusters.ids`` and ``gcs.base.protowire`` (the simulator); never
``gcs.server``, ``gcs.managers`` or ``gcs.services``.
"""
