#!/usr/bin/env bash
# The full test suite on a fresh machine: installs what it needs (virtualenv, redis-server,
# PostgreSQL binaries), then runs ruff, mypy and pytest.  Tests start their own servers on free
# ports; the interop tests build cached virtualenvs with ray==2.60.0 / ant-ray==2.44.1.1.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
bash scripts/ensure_services.sh
bash scripts/ensure_browser.sh  # chromium + chromedriver: the dashboard page tests
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy gcs
set +e
# Parallel by default (4 workers on this 2-core machine: the tests wait on conditions, not
# time, and must pass oversubscribed); any arguments replace the default.
if [ "$#" -eq 0 ]; then
  set -- -n 4 --dist loadgroup
fi
.venv/bin/python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
