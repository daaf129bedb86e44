"""``local`` provider: each instance is a ``gcs raylet`` process on this machine.

Node type, resources and labels come from the cluster YAML; the cloud instance id is a stable
local id (``local-<type>-<n>``) that the raylet reports as its ``instance_id``, so the
reconciler joins Ray nodes to instances.  Processes are remembered on disk
(:mod:`.processes`): an autoscaler restarted on the same ``state_dir`` finds them again.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import structlog

from gcs.autoscaler.config import ClusterConfig
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    CloudUnavailable,
    LaunchNodeError,
    ProviderContext,
    ProviderError,
)
from gcs.autoscaler.providers.processes import (
    ProcessRecord,
    ProcessRecords,
    spawn_logged,
    terminate_records,
)
from gcs.base.clock import Clock, SystemClock
from gcs.policy.autoscaling.model import NodeKind

log = structlog.get_logger("gcs.autoscaler.providers")


class LocalProvider:
    capabilities = Capabilities(starts_head=True, ends_with_server=True)

    def __init__(
        self,
        cluster: ClusterConfig,
        gcs_address: str,
        state_dir: str | Path,
        *,
        host: str = "127.0.0.1",
        python: str = sys.executable,
        extra_env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``python``: the interpreter that runs ``-m gcs raylet`` (tests stand a stub in)."""
        self._cluster = cluster
        self._clock = clock or SystemClock()
        self._gcs_address = gcs_address
        self._records = ProcessRecords(state_dir)
        self._host = host
        self._python = python
        self._env = dict(extra_env or {})
        self._errors: list[ProviderError] = []

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        try:
            return self._records.non_terminated()
        except OSError as err:
            raise CloudUnavailable(f"local provider: cannot read its records: {err}") from err

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if self._records.seen_request(request_id):
            return
        self._records.mark_request(request_id)
        self._records.prune()
        for node_type, count in shape.items():
            cfg = self._cluster.scheduler.node_types.get(node_type)
            if cfg is None:
                self._fail(node_type, count, request_id, f"unknown node type {node_type!r}")
                continue
            for _ in range(count):
                try:
                    await self._start(node_type, request_id)
                except OSError as err:
                    self._fail(node_type, 1, request_id, f"could not start raylet: {err}")

    async def _start(self, node_type: str, request_id: str) -> None:
        cfg = self._cluster.scheduler.node_types[node_type]
        is_head = node_type == self._cluster.head_node_type
        cloud_id = f"local-{node_type}-{uuid.uuid4().hex[:10]}"
        log_path = self._records.logs / f"{cloud_id}.log"
        cmd = [
            self._python, "-m", "gcs", "raylet",
            "--address", self._gcs_address,
            "--resources", json.dumps(dict(cfg.resources)),
            "--node-type", node_type,
            "--labels", json.dumps(dict(cfg.labels)),
            "--instance-id", cloud_id,
            "--node-name", cloud_id,
            "--host", self._host,
        ]  # fmt: skip
        if is_head:
            cmd.append("--head")
        proc = await spawn_logged(cmd, log_path, {**os.environ, **self._env})
        self._records.save(
            ProcessRecord(
                cloud_id,
                node_type,
                (NodeKind.HEAD if is_head else NodeKind.WORKER).value,
                request_id,
                proc.pid,
                self._clock.now_s(),
                str(log_path),
            )
        )
        log.info("provider.launched", cloud_instance_id=cloud_id, node_type=node_type, pid=proc.pid)

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        if self._records.seen_request(request_id):
            return
        self._records.mark_request(request_id)
        await terminate_records(self._records, cloud_instance_ids, self._clock)

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors

    def _fail(self, node_type: str, count: int, request_id: str, why: str) -> None:
        now_ns = int(self._clock.now_s() * 1e9)
        self._errors.append(LaunchNodeError(node_type, count, request_id, now_ns, why))
        log.warning("provider.launch_failed", node_type=node_type, error=why)


def build(context: ProviderContext) -> LocalProvider:
    """Raylets bind the host the GCS is reached on (so they reach it back)."""
    host = context.gcs_address.rsplit(":", 1)[0] or "127.0.0.1"
    return LocalProvider(
        context.cluster,
        context.gcs_address,
        context.state_dir,
        host=host,
        extra_env=context.child_env,
        clock=context.clock,
    )
