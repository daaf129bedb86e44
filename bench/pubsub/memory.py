"""Server RSS under the issue's pubsub memory attack: idle subscribers + large GcsPublish calls.

    python bench/pubsub/memory.py [--seconds 11] [--calls N] [--message-mib 8]
                                  [--stop-at-mib 2500]

Starts ``gcs serve`` (memory store, metrics on a free port), subscribes two subscribers
that never poll on each pubsub service (RAY_LOG on the observability service,
GCS_NODE_INFO on the control plane), then sends ``GcsPublish`` calls of one
``--message-mib`` message each, alternating services, for ``--seconds``.  Prints the
server's RSS (from /proc) before, at its peak and at the end, and the publishers' own
``gcs_pubsub_held_bytes`` / ``gcs_pubsub_dropped_*`` from the metrics endpoint.  Stops
early (and says so) if RSS passes ``--stop-at-mib``, so an unbounded build cannot take the
shared machine down.  Before the fix: 51 MB -> 4.2 GB in 11 s (issue 12).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.pubsub.vs_ray import free_port, load_avg, proc_rss_mb  # noqa: E402

_CP = "/ray.rpc.ControlPlanePubSubGcsService/"
_OBS = "/ray.rpc.ObservabilityPubSubService/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=11.0)
    parser.add_argument("--message-mib", type=float, default=8.0)
    parser.add_argument("--stop-at-mib", type=float, default=2500.0)
    parser.add_argument("--calls", type=int, default=0, help="stop after this many (0: no cap)")
    args = parser.parse_args()

    import grpc

    from gcs.proto import gcs_service_pb2, logging_pb2, pubsub_pb2

    port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gcs.cli.main import main; main()",
            "serve",
            "--host=127.0.0.1",
            f"--port={port}",
            "--storage=memory://",
            f"--metrics-port={metrics_port}",
            "--log-level=error",
        ],
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_send_message_length", 1 << 30)],
        )
        grpc.channel_ready_future(channel).result(timeout=30)
        ct = pubsub_pb2.ChannelType
        for service, chan in (
            (_OBS, ct.Value("RAY_LOG_CHANNEL")),
            (_CP, ct.Value("GCS_NODE_INFO_CHANNEL")),
        ):
            for n in (1, 2):
                req = gcs_service_pb2.GcsSubscriberCommandBatchRequest(
                    subscriber_id=bytes([n]) * 28
                )
                req.commands.add(channel_type=chan).subscribe_message.SetInParent()
                channel.unary_unary(service + "GcsSubscriberCommandBatch")(
                    req.SerializeToString(), timeout=10
                )
        size = int(args.message_mib * (1 << 20))
        log = pubsub_pb2.PubMessage(channel_type=ct.Value("RAY_LOG_CHANNEL"))
        log.log_batch_message.CopyFrom(logging_pb2.LogBatch(ip="x", lines=["x" * size]))
        node = pubsub_pb2.PubMessage(channel_type=ct.Value("GCS_NODE_INFO_CHANNEL"), key_id=b"n")
        node.node_info_message.node_name = "x" * size
        requests = [
            (_OBS, gcs_service_pb2.GcsPublishRequest(pub_messages=[log]).SerializeToString()),
            (_CP, gcs_service_pb2.GcsPublishRequest(pub_messages=[node]).SerializeToString()),
        ]
        time.sleep(0.5)
        rss0 = peak = proc_rss_mb(proc.pid)
        sent = errors = 0
        stopped_early = False
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.seconds and not (args.calls and sent >= args.calls):
            service, raw = requests[sent % 2]
            try:
                channel.unary_unary(service + "GcsPublish")(raw, timeout=30)
            except grpc.RpcError:
                errors += 1
            sent += 1
            peak = max(peak, proc_rss_mb(proc.pid))
            if peak > args.stop_at_mib:
                stopped_early = True
                break
        elapsed = time.monotonic() - t0
        time.sleep(0.5)
        end = proc_rss_mb(proc.pid)
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
        series = {
            m.group(1): float(m.group(2))
            for m in re.finditer(rb'^(gcs_pubsub_\w+\{publisher="\w+"\}) (\S+)$', text, re.M)
        }
        print(
            f"{sent} GcsPublish calls of {args.message_mib:g} MiB in {elapsed:.1f} s "
            f"({sent * args.message_mib:.0f} MiB published, {errors} rejected), load=[{load_avg()}]"
        )
        print(f"server RSS MB: before={rss0:.0f} peak={peak:.0f} end={end:.0f}")
        if stopped_early:
            print(f"STOPPED EARLY: RSS passed {args.stop_at_mib:.0f} MB (unbounded)")
        for key, value in sorted(series.items()):
            print(f"  {key.decode()} = {value:.0f}")
        channel.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


if __name__ == "__main__":
    main()
