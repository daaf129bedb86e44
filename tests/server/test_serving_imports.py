"""What ``gcs serve`` loads: every module imported is memory the GCS holds for its lifetime
(Python keeps each module's code, functions and classes), so the serving path imports only
what serving with its configuration needs."""

from __future__ import annotations

import subprocess
import sys

PROBE = (
    "import sys\n"
    "import gcs.cli.main\n"
    "from gcs.server import GcsServer\n"
    "unused = ('gcs.sdk', 'gcs.policy.autoscaling', 'gcs.autoscaler', 'kubernetes', 'boto3',\n"
    "          'botocore', 'sqlalchemy', 'alembic', 'redis', 'jinja2', 'matplotlib', 'yaml')\n"
    "print(','.join(m for m in sys.modules if m.split('.')[0] in unused or\n"
    "               any(m == u or m.startswith(u + '.') for u in unused)))\n"
)


def test_the_server_module_does_not_import_the_client_sdk_cloud_or_sql_libraries() -> None:
    # the client SDK pulled in the autoscaling scheduler (~0.5 MB) for two KV key names, and
    # the YAML library was loaded with no config file to read
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == ""
