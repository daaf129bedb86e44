"""``command`` provider: a start and a stop command per node type.

Commands come from each node type's ``node_config`` (``start_command``, optional
``stop_command``) and are templated with ``{cloud_instance_id}``, ``{node_type}`` and
``{gcs_address}``; they also get ``RAY_CLOUD_INSTANCE_ID`` and ``RAY_NODE_TYPE_NAME`` in their
environment, which Ray's raylet reports as its instance id and node type, so a plain
``ray start --address {gcs_address} --block`` worker joins its instance.

A start command that stays in the foreground (``--block``) is tracked by its process; one
that daemonizes and exits 0 is tracked by its record until terminated (the stop command is
then the only way to stop it, and is required).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import structlog

from gcs.autoscaler.config import ConfigError
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    CloudUnavailable,
    LaunchNodeError,
    ProviderContext,
    ProviderError,
    TerminateNodeError,
)
from gcs.autoscaler.providers.processes import (
    ProcessRecord,
    ProcessRecords,
    kill_group,
    spawn_logged,
)
from gcs.base.clock import Clock, SystemClock, within
from gcs.policy.autoscaling.model import NodeKind

log = structlog.get_logger("gcs.autoscaler.providers")


@dataclass(frozen=True, slots=True)
class NodeCommands:
    start: str
    stop: str = ""


class CommandProvider:
    def __init__(
        self,
        commands: Mapping[str, NodeCommands],
        gcs_address: str,
        state_dir: str | Path,
        *,
        head_node_type: str = "",
        command_timeout_s: float = 120.0,
        extra_env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._clock = clock or SystemClock()
        self._extra_env = dict(extra_env or {})
        self._commands = dict(commands)
        self._gcs_address = gcs_address
        self._records = ProcessRecords(state_dir)
        self._head = head_node_type
        self._timeout_s = command_timeout_s
        self._errors: list[ProviderError] = []
        # the head is brought up at start only when its type has a start command
        self.capabilities = Capabilities(starts_head=head_node_type in self._commands)

    def _env(self, cloud_id: str, node_type: str) -> dict[str, str]:
        return {
            **os.environ,
            **self._extra_env,
            "RAY_CLOUD_INSTANCE_ID": cloud_id,
            "RAY_NODE_TYPE_NAME": node_type,
        }

    def _render(self, template: str, cloud_id: str, node_type: str) -> list[str]:
        text = template.format(
            cloud_instance_id=cloud_id, node_type=node_type, gcs_address=self._gcs_address
        )
        return shlex.split(text)

    async def get_non_terminated(self) -> Mapping[str, CloudInstance]:
        try:
            return self._records.non_terminated()
        except OSError as err:
            raise CloudUnavailable(f"command provider: cannot read its records: {err}") from err

    async def launch(self, shape: Mapping[str, int], request_id: str) -> None:
        if self._records.seen_request(request_id):
            return
        self._records.mark_request(request_id)
        self._records.prune()
        for node_type, count in shape.items():
            cmds = self._commands.get(node_type)
            if cmds is None:
                self._launch_error(node_type, count, request_id, "no start_command for this type")
                continue
            for _ in range(count):
                await self._start(node_type, cmds, request_id)

    async def _start(self, node_type: str, cmds: NodeCommands, request_id: str) -> None:
        cloud_id = f"cmd-{node_type}-{uuid.uuid4().hex[:10]}"
        log_path = self._records.logs / f"{cloud_id}.log"
        try:
            argv = self._render(cmds.start, cloud_id, node_type)
            proc = await spawn_logged(argv, log_path, self._env(cloud_id, node_type))
        except (OSError, ValueError, KeyError) as err:
            self._launch_error(node_type, 1, request_id, f"start command failed: {err}")
            return
        kind = NodeKind.HEAD if node_type == self._head else NodeKind.WORKER
        started_s = self._clock.now_s()
        record = ProcessRecord(
            cloud_id, node_type, kind.value, request_id, proc.pid, started_s, str(log_path)
        )
        self._records.save(record)
        # A start command that exits at once either failed or daemonized.
        try:
            code = await within(self._clock, 2.0, proc.wait())
        except TimeoutError:
            return  # still running in the foreground: tracked by pid
        if code != 0:
            self._records.forget(cloud_id)
            self._launch_error(
                node_type, 1, request_id, f"start command exited {code} (log: {log_path})"
            )
            return
        # Daemonized: keep the record with pid 0 ("tracked by record only").
        self._records.save(
            ProcessRecord(
                cloud_id, node_type, kind.value, request_id, 0, record.started_s, str(log_path)
            )
        )

    async def terminate(self, cloud_instance_ids: Sequence[str], request_id: str) -> None:
        if self._records.seen_request(request_id):
            return
        self._records.mark_request(request_id)
        known = self._records.load()
        for cid in cloud_instance_ids:
            rec = known.get(cid)
            if rec is None:
                continue
            cmds = self._commands.get(rec.node_type)
            if cmds is not None and cmds.stop:
                ok = await self._run_stop(cmds.stop, cid, rec.node_type, request_id)
                if not ok:
                    continue
            if rec.pid:
                await kill_group(rec.pid, self._clock)
            self._records.forget(cid)

    async def _run_stop(self, template: str, cid: str, node_type: str, request_id: str) -> bool:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self._render(template, cid, node_type),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=self._env(cid, node_type),
            )
            _, err = await within(self._clock, self._timeout_s, proc.communicate())
        except (OSError, ValueError, KeyError, TimeoutError) as exc:
            self._errors.append(TerminateNodeError(cid, request_id, self._now_ns(), str(exc)))
            return False
        if proc.returncode != 0:
            why = f"stop command exited {proc.returncode}: {err.decode(errors='replace')[-300:]}"
            self._errors.append(TerminateNodeError(cid, request_id, self._now_ns(), why))
            return False
        return True

    def poll_errors(self) -> list[ProviderError]:
        errors, self._errors = self._errors, []
        return errors

    def _launch_error(self, node_type: str, count: int, request_id: str, why: str) -> None:
        self._errors.append(LaunchNodeError(node_type, count, request_id, self._now_ns(), why))
        log.warning("provider.launch_failed", node_type=node_type, error=why)

    def _now_ns(self) -> int:
        return int(self._clock.now_s() * 1e9)


def section(raw: Mapping[str, Any], types_raw: Mapping[Any, Any]) -> dict[str, NodeCommands]:
    """The registry row's section parser: per node type, ``node_config.start_command`` (and
    ``stop_command``); at least one type must have a start command."""
    commands: dict[str, NodeCommands] = {}
    for name, node in types_raw.items():
        node_config = node.get("node_config") if isinstance(node, Mapping) else None
        if node_config is None:
            continue
        where = f"available_node_types.{name}.node_config"
        start, stop = node_config.get("start_command"), node_config.get("stop_command", "")
        if not isinstance(start, str) or not start.strip():
            raise ConfigError(f"{where}.start_command: required for provider type command")
        if not isinstance(stop, str):
            raise ConfigError(f"{where}.stop_command: expected a string")
        commands[str(name)] = NodeCommands(start, stop)
    if not commands:
        raise ConfigError("provider.type command: no node type has node_config.start_command")
    return commands


def build(context: ProviderContext) -> CommandProvider:
    commands = cast("Mapping[str, NodeCommands]", context.cluster.provider.settings)
    return CommandProvider(
        commands,
        context.gcs_address,
        context.state_dir,
        head_node_type=context.cluster.head_node_type,
        extra_env=context.child_env,
        clock=context.clock,
    )
