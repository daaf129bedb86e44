"""moto's EC2 server for the AWS provider's tests, with a fault proxy in front of it.

:class:`Ec2World` starts moto's server (``ThreadedMotoServer``) on a free port and a small
HTTP proxy before it; the provider reaches the proxy through boto3's own
``AWS_ENDPOINT_URL_EC2`` (:meth:`Ec2World.env`).  The proxy forwards every call to moto
except those a rule answers with AWS's error document (capacity, quota, throttling, a
failing API), and counts the calls by action.  :meth:`Ec2World.client` is a boto3 client of
moto itself (the test's hands: what AWS or an operator does behind the provider's back).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs

import pytest

from gcs.testing.http_server import QuietHTTPServer

moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed")
boto3 = pytest.importorskip("boto3", reason="boto3 is not installed")

REGION = "us-west-2"
IMAGE = "ami-12c6146b"  # one of moto's images
Params = dict[str, str]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Rule:
    action: str
    code: str
    times: int = 1
    when: Callable[[Params], bool] = lambda params: True
    status: int = 400
    message: str = ""
    hits: int = 0


@dataclass
class Proxy:
    upstream: int
    rules: list[Rule] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)
    log: list[Params] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, params: Params) -> Rule | None:
        with self.lock:
            self.calls[params.get("Action", "?")] += 1
            self.log.append(params)
            for rule in self.rules:
                live = rule.hits < rule.times and rule.action == params.get("Action")
                if live and rule.when(params):
                    rule.hits += 1
                    return rule
        return None


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return None

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            params = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            rule = proxy.answer(params)
            if rule is not None:
                doc = (
                    '<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error>'
                    f"<Code>{rule.code}</Code><Message>{rule.message or rule.code}</Message>"
                    "</Error></Errors><RequestID>injected</RequestID></Response>"
                ).encode()
                self._reply(rule.status, doc, "text/xml")
                return
            conn = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            conn.request("POST", self.path, body, headers)
            up = conn.getresponse()
            data = up.read()
            conn.close()
            self._reply(up.status, data, up.getheader("Content-Type") or "text/xml")

        def _reply(self, status: int, data: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


class Ec2World:
    def __init__(self) -> None:
        self.moto_port = free_port()
        self._moto = moto_server.ThreadedMotoServer(
            ip_address="127.0.0.1", port=self.moto_port, verbose=False
        )
        self._moto.start()
        self.reset()  # moto's state is the process's: start from an empty region
        self.proxy = Proxy(self.moto_port)
        self._http = QuietHTTPServer(("127.0.0.1", 0), _handler(self.proxy))
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._http.server_address[1]}"
        self.client = boto3.client(
            "ec2",
            region_name=REGION,
            endpoint_url=f"http://127.0.0.1:{self.moto_port}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self._provider_client: Any = None

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL_EC2": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": REGION,
        }

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in self.env().items():
                mp.setenv(key, value)
            mp.delenv("AWS_PROFILE", raising=False)
            yield

    def fail(self, action: str, code: str, **kw: Any) -> Rule:
        rule = Rule(action, code, **kw)
        with self.proxy.lock:
            self.proxy.rules.append(rule)
        return rule

    def writes(self) -> int:
        with self.proxy.lock:
            return sum(n for a, n in self.proxy.calls.items() if not a.startswith("Describe"))

    def instances(self, cluster: str, states: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        filters = [{"Name": "tag:ray-cluster-name", "Values": [cluster]}]
        if states:
            filters.append({"Name": "instance-state-name", "Values": list(states)})
        pages = self.client.get_paginator("describe_instances").paginate(Filters=filters)
        return [i for p in pages for r in p["Reservations"] for i in r["Instances"]]

    def user_data(self, instance_id: str) -> str:
        import base64

        got = self.client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        return base64.b64decode(got["UserData"]["Value"]).decode()

    def spot_interrupt(self, instance_id: str) -> None:
        """AWS takes a spot instance back: terminated, with the reason AWS gives."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.instances import StateReason

        self.client.terminate_instances(InstanceIds=[instance_id])
        inst = ec2_backends[DEFAULT_ACCOUNT_ID][REGION].get_instance(instance_id)
        code = "Server.SpotInstanceTermination"
        inst.state_reason = StateReason(f"{code}: Spot instance termination", code)

    def reset(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.moto_port, timeout=60)
        conn.request("POST", "/moto-api/reset")
        conn.getresponse().read()
        conn.close()

    def provider_client(self) -> Any:
        """A client as the provider builds it, through the proxy (built once: loading
        boto3's EC2 model takes a second)."""
        if self._provider_client is None:
            from gcs.autoscaler.providers.aws.session import make_client

            with self.environment():
                self._provider_client = make_client(REGION, {})
        return self._provider_client

    def fresh(self) -> Ec2World:
        """Empty again: no instances, no rules, no counts."""
        self.reset()
        with self.proxy.lock:
            self.proxy.rules.clear()
            self.proxy.calls.clear()
            self.proxy.log.clear()
        return self

    def close(self) -> None:
        self.reset()
        self._http.shutdown()
        self._http.server_close()
        self._moto.stop()


_SHARED: list[Ec2World] = []


def shared_world() -> Ec2World:
    """One moto server per test process (starting one takes seconds), emptied per use;
    stopped when the process exits."""
    if not _SHARED:
        import atexit

        world = Ec2World()
        atexit.register(world.close)
        _SHARED.append(world)
    return _SHARED[0].fresh()
