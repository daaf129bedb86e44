"""Export Ray's GCS metrics to the node's metrics agent, as Ray's ``gcs_server`` does.

A component (load / run / close): ``load`` takes the baseline (what start-up loaded is not
counted as new), ``run`` exports every ``metrics_report_interval_ms`` on the injected
clock, ``close`` hangs up.  Where to: ``target()``, asked before each export -- Ray starts
its GCS before the agent (``--metrics-agent-port=0``) and the GCS learns the port when the
head node registers, so the target may be unknown for a while or change (a new head).
The agent may start after the GCS, restart, or not exist; an export it does not
acknowledge is carried by the next one (:class:`DeltaEncoder`), one warning is logged per
outage, and an agent without the OTLP service (``RAY_enable_open_telemetry=0``) ends the
export with one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc
import structlog

from gcs.base.clock import Clock
from gcs.proto import otlp_metrics_pb2 as otlp
from gcs.rpc.security import Security
from gcs.server.ray_metrics import DeltaEncoder, Family

__all__ = ["EXPORT_METHOD", "MIN_INTERVAL_MS", "MetricsAgentExporter"]

log = structlog.get_logger("gcs.metrics_agent")

MIN_INTERVAL_MS = 1000
"""Ray floors ``metrics_report_interval_ms`` here (its agent keeps a gauge 2 intervals)."""

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
"""OTLP's method, served by Ray's agent (its messages: :mod:`gcs.proto.otlp_metrics_pb2`)."""

Snapshot = Callable[[], list[Family]]


class MetricsAgentExporter:
    name = "metrics_agent"

    def __init__(
        self,
        *,
        target: Callable[[], str | None],
        snapshot: Snapshot,
        global_labels: Mapping[str, str],
        interval_ms: int,
        clock: Clock,
        security: Security,
    ) -> None:
        self._target = target
        self.target: str | None = None
        """Where the last export went."""
        self._snapshot = snapshot
        self._encoder = DeltaEncoder(global_labels)
        self._interval_s = max(interval_ms, MIN_INTERVAL_MS) / 1000
        self._clock = clock
        self._security = security
        self._channel: grpc.aio.Channel | None = None
        self._failing = False
        self.exports = 0
        """Exports the agent acknowledged."""
        self.unsupported = False
        """The agent does not serve OTLP: exporting stopped."""

    async def load(self) -> None:
        self._encoder.baseline(self._snapshot())

    async def run(self) -> None:
        while not self.unsupported:
            await self._clock.sleep(self._interval_s)
            await self.export_once()  # nothing while the target is unknown

    async def export_once(self) -> bool:
        """One export of what changed since the last acknowledged one; True once acked."""
        target = self._target()
        if target is None:
            return False
        if target != self.target:
            await self.close()
            self.target, self._failing = target, False
            log.info("metrics_agent.target", target=target)
        if self._channel is None:
            self._channel = self._security.aio_channel(target)
        request, sent = self._encoder.request(self._snapshot(), int(self._clock.now_s() * 1e9))
        export = self._channel.unary_unary(
            EXPORT_METHOD,
            request_serializer=otlp.ExportMetricsServiceRequest.SerializeToString,
            response_deserializer=otlp.ExportMetricsServiceResponse.FromString,
        )
        try:
            await export(request, timeout=self._interval_s / 2)  # Ray's: half
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
                log.info(
                    "metrics_agent.no_otlp",
                    target=self.target,
                    detail="the agent does not serve OTLP metrics (RAY_enable_open_telemetry=0?)"
                    "; Ray's GCS metrics are not exported there",
                )
            elif not self._failing:
                self._failing = True
                log.warning(
                    "metrics_agent.export_failed",
                    target=self.target,
                    code=err.code().name,
                    error=err.details(),
                )
            return False
        self._encoder.commit(sent)
        self.exports += 1
        if self._failing:
            self._failing = False
            log.info("metrics_agent.export_resumed", target=self.target)
        return True

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()
