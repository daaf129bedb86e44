#!/usr/bin/env bash
# The full test suite on a fresh machine: installs what it needs (virtualenv, redis-server,
# PostgreSQL binaries, and the interop virtualenvs with ray==2.60.0 / ray[default] /
# ant-ray==2.44.1.1 under ${GCS_INTEROP_CACHE:-~/.cache/gcs-interop}), then runs ruff, mypy
# and pytest.  Everything slow and networked happens before pytest starts: a test never
# installs (tests/interop/fixtures.py).  Tests start their own servers on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/ensure_services.sh
bash scripts/ensure_browser.sh  # chromium + chromedriver: the dashboard page tests
# A line per step with the seconds since this stage began; pip's output goes to the log
# each failure names.  A failed build stops here, one line on stderr.
.venv/bin/python -m tests.interop.venvs
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy gcs
set +e
# Parallel by default (4 workers on this 2-core machine: the tests wait on conditions, not
# time, and must pass oversubscribed); any arguments replace the default.
if [ "$#" -eq 0 ]; then
  set -- -n 4 --dist loadgroup
fi
# Built above: a venv missing now is a failure, not a skip.
GCS_INTEROP_REQUIRED=1 .venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
