"""CPU a ``gcs`` command costs before it does anything: the CLI's start-up.

Each case runs ``python -m gcs <argv>`` (a command that fails at once on a bad flag, or
prints help) ``--runs`` times and reports the median CPU time (user + system, children's
rusage: steadier than wall time on a loaded machine).  The baseline, run in the same
process, is the same command with every subcommand module imported first, as ``gcs.cli.main``
did before its subcommands were loaded on demand (``GcsGroup(lazy_commands=...)``).

    python -m bench.cli.startup [--runs 7]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys

EAGER_MODULES = (
    "gcs.cli.store",
    "gcs.cli.autoscaler",
    "gcs.cli.autoscaler_run",
    "gcs.cli.vcluster",
    "gcs.cli.raylet",
    "gcs.cli.dropin.cli",
)
CASES = (
    ("status --bogus", ["status", "--bogus"]),
    ("health --bogus", ["health", "--bogus"]),
    ("vcluster list --bogus", ["vcluster", "list", "--bogus"]),
    ("autoscaler plan --bogus", ["autoscaler", "plan", "--bogus"]),
    ("--help", ["--help"]),
)


def _cpu_s(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _median(argv: list[str], runs: int) -> float:
    return statistics.median(_cpu_s(argv) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    eager = "; ".join(f"import {m}" for m in EAGER_MODULES)
    print(f"{'command':28} {'lazy ms':>8} {'eager ms':>9} {'ratio':>6}")
    for label, argv in CASES:
        lazy = _median([sys.executable, "-m", "gcs", *argv], args.runs)
        baseline = _median(
            [sys.executable, "-c", f"{eager}; from gcs.cli.main import main; main()", *argv],
            args.runs,
        )
        print(f"{label:28} {lazy * 1e3:8.0f} {baseline * 1e3:9.0f} {lazy / baseline:6.2f}")


if __name__ == "__main__":
    main()
