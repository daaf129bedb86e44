"""``aws`` provider: EC2 instances launched with ``run_instances`` (boto3).

Modules, one concern each: :mod:`.settings` (the ``provider:`` keys of Ray's cluster
launcher and each node type's ``node_config``), :mod:`.session` (the EC2 client and the one
way its blocking calls run: off the event loop, throttling retried on the injected clock),
:mod:`.errors` (AWS error codes -> what the autoscaler does), :mod:`.userdata` (the script an
instance boots with), :mod:`.describe` (listing, paginated), :mod:`.launch` (stopped-instance
reuse, subnets in order, idempotent per request id), :mod:`.provider` (the contract) and
:mod:`.resources` (node type resources from ``describe_instance_types``, Ray's rules).
"""
