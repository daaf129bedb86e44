"""GCS CPU and load-poll lag with a fleet of raylet agents (issue 3: 2,000 raylets at 1 s
polling, target <= 0.6 core for the GCS).

The GCS runs as its own process (`gcs serve`, memory store, Ray's default health and poll
settings); the fleet (`gcs raylet-fleet`) runs in K other processes.  After every node has
registered and a warm-up, the GCS process's CPU time is read from /proc over a window, and the
poller's figures are scraped from its Prometheus endpoint.

    python -m bench.gcs.poll_fleet [--nodes 2000] [--processes 2] [--window 20]

Prints: GCS cores used, GetResourceLoad calls/s completed, GCS CPU per call, the duration of
the last poll round and the age of the oldest node report (poll lag).  The fleet competes for
the same 2 cores, so at 2,000 agents the fleet itself, not the GCS, bounds the poll rate:
compare CPU per call across sizes.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from gcs.testing.ports import free_port

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
    return (int(fields[11]) + int(fields[12])) / _TICKS


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for name in (
        "gcs_load_poll_round_seconds",
        "gcs_load_poll_max_staleness_seconds",
        "gcs_load_poll_failures",
        "gcs_load_poll_ok_total",
        "gcs_health_check_failures",
        "gcs_health_checks_total",
    ):
        match = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.M)
        if match:
            out[name] = float(match.group(1))
    alive = re.search(r'^gcs_nodes\{state="ALIVE"\} ([0-9.e+-]+)$', text, re.M)
    out["alive"] = float(alive.group(1)) if alive else 0.0
    return out


def run(nodes: int, processes: int, window_s: float) -> None:
    port, metrics = free_port(), free_port()
    gcs = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gcs.cli.main",
            "serve",
            "--port",
            str(port),
            "--storage",
            "memory://",
            "--metrics-port",
            str(metrics),
            "--log-level",
            "warning",
            "--log-format",
            "json",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fleet = None
    try:
        time.sleep(2)
        fleet = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gcs.cli.main",
                "raylet-fleet",
                "--gcs-address",
                f"127.0.0.1:{port}",
                "--count",
                str(nodes),
                "--processes",
                str(processes),
                "--resources",
                '{"CPU": 4}',
                "--node-type",
                "cpu4",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 180
        while scrape(metrics)["alive"] < nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {scrape(metrics)['alive']} of {nodes} registered")
            time.sleep(1)
        time.sleep(8)  # warm-up: initial health-check delay passes, polls settle
        before, cpu0, t0 = scrape(metrics), cpu_seconds(gcs.pid), time.monotonic()
        time.sleep(window_s)
        after, cpu1, t1 = scrape(metrics), cpu_seconds(gcs.pid), time.monotonic()
        cores = (cpu1 - cpu0) / (t1 - t0)
        calls = after.get("gcs_load_poll_ok_total", 0) - before.get("gcs_load_poll_ok_total", 0)
        rate = calls / (t1 - t0)
        print(
            f"nodes={nodes} fleet_processes={processes}: GCS {cores:.2f} cores "
            f"(target <= 0.6 at 2000); GetResourceLoad ok {rate:.0f}/s of {nodes}/s wanted; "
            f"GCS CPU per poll {1e6 * cores / max(rate, 1):.0f} us; "
            f"last round {after.get('gcs_load_poll_round_seconds', 0):.2f} s; "
            f"oldest report {after.get('gcs_load_poll_max_staleness_seconds', 0):.2f} s; "
            f"alive {after['alive']:.0f}; "
            f"poll failures {before.get('gcs_load_poll_failures', 0):.0f} before window, "
            f"{after.get('gcs_load_poll_failures', 0):.0f} after; "
            f"health failures {after.get('gcs_health_check_failures', 0):.0f}"
        )
    finally:
        for proc in (fleet, gcs):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 1000, 2000])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0)
    args = parser.parse_args()
    for n in args.nodes:
        run(n, args.processes, args.window)
