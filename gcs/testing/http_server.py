"""A threaded HTTP server for in-process fakes that never prints a traceback from its threads.

``socketserver``'s default ``handle_error`` formats a traceback on its handler thread. On
CPython 3.11 formatting a traceback parses the failing line with :mod:`ast` (for the ``^^^``
markers), and the parser's recursion counter is shared by all threads: a fake's thread doing so
while the test's thread parses code (``tests/unit/test_layers.py`` does) fails the test with
``SystemError: AST constructor recursion depth mismatch`` (seen in CI). A client that hangs up
(a reset, a broken pipe) is routine for a fake and is ignored, as werkzeug ignores it; any
other handler error is kept in :attr:`QuietHTTPServer.errors` for the test to read.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer
from typing import Any


class QuietHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.errors: list[str] = []
        """``"<client>: <ExceptionType>: <message>"`` per handler failure other than a hang-up."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        error = sys.exc_info()[1]
        if error is None or isinstance(error, ConnectionError):
            return
        with self._lock:
            self.errors.append(f"{client_address}: {type(error).__name__}: {error}")
