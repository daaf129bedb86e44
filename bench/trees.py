"""The hot-path benches on this tree and on a baseline commit, in one run, as ratios.

    python -m bench.trees [--base REF] [--only poll state pubsub scheduler] [--rounds 2]

"Nothing that was fast may get slower" is checked here: the baseline (a commit, default
``HEAD~1``) is checked out into a temporary worktree (its protos generated), and each bench
runs on both trees alternately (base, ours, ours, base, ... so a drift of the machine's
load falls on both), with this Python.  Prints each figure's median on both trees and
ours / base, and the load average before and after.  Logs of every run are kept under
``--logs`` (a failed run names its log and the reason and the exit status is 1).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Bench:
    name: str
    argv: tuple[str, ...]
    figures: dict[str, str]  # label -> regex with one float group (lower is better)
    timeout_s: float = 600.0


BENCHES = (
    Bench(
        "poll",
        ("-m", "bench.gcs.poll_fleet", "--nodes", "2000", "--window", "15"),
        {
            "GCS CPU per poll (us), 2,000 raylets": r"GCS CPU per poll (\d+) us",
            "GCS cores, 2,000 raylets": r"GCS ([\d.]+) cores",
        },
    ),
    Bench(
        "state",
        ("-m", "bench.gcs.state_under_poll", "--nodes", "2000", "--seconds", "25"),
        {
            "GetClusterResourceState p99 (ms), 2,000 polled": (
                r"GetClusterResourceState p50=[\d.]+ ms p99=([\d.]+) ms"
            ),
            "GCS CPU per poll (us), reads on": r"([\d.]+) us CPU per poll",
        },
    ),
    Bench(
        "pubsub",
        ("bench/pubsub/run.py", "--subscribers", "2000", "--publishes", "20"),
        {
            "publish -> last of 2,000 subscribers p99 (ms)": r"last subscriber received ms: "
            r"p50=[\d.]+ p99=([\d.]+)",
            "server CPU per RPC event (us)": r"= (\d+) us per RPC event",
        },
    ),
    Bench(
        "scheduler",
        ("bench/scheduler/run.py", "--skip-ray", "--repeat", "3"),
        {"scheduler big case (s)": r"big:\s+([\d.]+) s"},
    ),
)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _checkout(ref: str, into: Path) -> Path:
    tree = into / "base"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), ref],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [sys.executable, "setup.py", "--protos-only"], cwd=tree, check=True, capture_output=True
    )
    return tree


def _run(bench: Bench, tree: Path, log: Path) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, *bench.argv],
            cwd=tree,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=bench.timeout_s,
            check=False,
        )
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{bench.name} on {tree} exited {proc.returncode}: see {log}")
    figures = {}
    for label, pattern in bench.figures.items():
        found = re.search(pattern, text)
        if found is None:
            raise RuntimeError(f"{bench.name} on {tree}: no figure {label!r} in {log}")
        figures[label] = float(found.group(1))
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="HEAD~1", help="the baseline commit (default HEAD~1)")
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHES])
    parser.add_argument("--rounds", type=int, default=1, help="runs per tree per bench")
    parser.add_argument("--logs", type=Path, default=None)
    args = parser.parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="gcs-bench-trees-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {_load()}; logs in {logs}", flush=True)
    scratch = Path(tempfile.mkdtemp(prefix="gcs-bench-base-"))
    base = _checkout(args.base, scratch)
    failed = False
    try:
        rows = []
        for bench in BENCHES:
            if args.only and bench.name not in args.only:
                continue
            got: dict[str, dict[str, list[float]]] = {"ours": {}, "base": {}}
            order = ["base", "ours", "ours", "base"] * args.rounds
            order = order[: 2 * args.rounds]
            try:
                for index, which in enumerate(order):
                    tree = ROOT if which == "ours" else base
                    started = time.monotonic()
                    figures = _run(bench, tree, logs / f"{bench.name}-{which}-{index}.log")
                    print(
                        f"{bench.name} {which}: "
                        + "; ".join(f"{k} {v:g}" for k, v in figures.items())
                        + f" ({time.monotonic() - started:.0f} s, load {_load()})",
                        flush=True,
                    )
                    for label, value in figures.items():
                        got[which].setdefault(label, []).append(value)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"FAILED {bench.name}: {exc}", file=sys.stderr, flush=True)
                failed = True
                continue
            for label in bench.figures:
                ours = statistics.median(got["ours"][label])
                theirs = statistics.median(got["base"][label])
                rows.append((label, ours, theirs, ours / theirs if theirs else float("nan")))
        print(f"\n{'figure':52} {'ours':>10} {'base':>10} {'ours/base':>9}")
        for label, ours, theirs, ratio in rows:
            print(f"{label:52} {ours:10.2f} {theirs:10.2f} {ratio:9.2f}")
        print(f"load average after: {_load()}; base = {args.base}")
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
            check=False,
            capture_output=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
