"""Fuzz every unary method the GCS serves: malformed bytes and hostile-but-decodable values.

A seeded generator (fixed seed, fixed count: the same requests every run) drives a real
``gcs serve`` subprocess.  Two families per method:

* malformed bytes: random bytes, truncated and bit-flipped encodings of generated requests;
* hostile values built from the method's request descriptor: huge strings and bytes,
  inf/nan/negative floats, extreme integers, unknown enum numbers, long repeated fields and
  maps, random and nil ids.

Every answer must be a clean status: never UNKNOWN (Ray's client retries it silently) and
never INTERNAL (an unhandled exception).  Afterwards the server is alive, answers a health
check and a normal call, and its resident memory grew by a bounded amount.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import pathlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from gcs.rpc import descriptors as svc
from gcs.rpc.method_paths import method_path
from tests.server.gcs_process import GcsProcess

pytestmark = pytest.mark.slow

SEED = 20261123
MALFORMED_PER_METHOD = 16
HOSTILE_PER_METHOD = 24
HUGE = 1024 * 1024 + 7
"""Length of a "huge" string or bytes value (over every per-field limit)."""
MESSAGES_PER_REQUEST = 1000
"""Nested messages in one generated request (the test process builds them too)."""
OVERSIZED = 9 * 1024 * 1024
"""Over the default ``max_request_bytes``: a repeated run of empty sub-messages this long
decodes to ~30x its size."""
RSS_GROWTH_LIMIT_BYTES = 256 * 1024 * 1024
RSS_PEAK_LIMIT_BYTES = 512 * 1024 * 1024
# Held until something happens (Ray holds a wait on an unknown group too: create and wait
# may arrive in either order), so the caller's deadline is their normal end.
LONG_POLLS = {"GcsSubscriberPoll", "WaitPlacementGroupUntilReady"}
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}

# No plain host names except "localhost": a registered node's address may be dialed, and the
# test must not make DNS queries.
STRINGS = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "é" * 3,
    "ü" * 300,
    "../../etc/passwd",
    "http://127.0.0.1:1/path",
    "%s%n%x",
    "##",
    "kPrimaryClusterID##job",
    "CPU",
    "GPU",
    "127.0.0.1",
    "::1",
    "localhost",
    "0.0.0.0",
    "1.2.3.4.5",
    "-bad-",
    "a" * 64 + ".example",
)
DOUBLES = (float("inf"), float("-inf"), float("nan"), -1.0, -0.0, 0.0, 1e308, 5e-324, 1.0, 4.0)
INTS = {
    "int32": (0, 1, -1, 2**31 - 1, -(2**31)),
    "int64": (0, 1, -1, 2**63 - 1, -(2**63), 10**12),
    "uint32": (0, 1, 2**32 - 1, 65535, 65536),
    "uint64": (0, 1, 2**64 - 1, 2**63),
}
_INT_KIND = {
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_SINT32: "int32",
    FieldDescriptor.TYPE_SFIXED32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_SINT64: "int64",
    FieldDescriptor.TYPE_SFIXED64: "int64",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_FIXED32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
    FieldDescriptor.TYPE_FIXED64: "uint64",
}


@dataclass(frozen=True)
class Method:
    service: str
    name: str
    path: str
    request_cls: Any


def unary_methods() -> list[Method]:
    out = []
    for service in svc.SERVED_BY_GCS:
        for method in service.methods:
            if method.client_streaming or method.server_streaming:
                continue
            out.append(
                Method(
                    service.name,
                    method.name,
                    method_path(method),
                    GetMessageClass(method.input_type),
                )
            )
    return out


class HostileValues:
    """Builds hostile-but-decodable messages from a descriptor with one seeded ``Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        # A small pool, so that later requests hit entities earlier ones created.
        self.ids = {n: [rng.randbytes(n) for _ in range(3)] for n in (4, 16, 18, 28)}
        self._budget = 0
        self._messages = 0

    def message(self, cls: Any) -> Message:
        self._budget = 2 * HUGE  # at most two huge values per request
        self._messages = MESSAGES_PER_REQUEST
        msg = cls()
        self._fill(msg, depth=0)
        return msg

    def _fill(self, msg: Message, depth: int) -> None:
        for field in msg.DESCRIPTOR.fields:
            if self.rng.random() < 0.35:
                continue
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                self._fill_map(msg, field, depth)
            elif field.is_repeated:
                self._fill_repeated(msg, field, depth)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                if depth < 4:
                    self._fill(getattr(msg, field.name), depth + 1)
                    getattr(msg, field.name).SetInParent()
            else:
                setattr(msg, field.name, self.scalar(field))

    def _count(self, *, bulky: bool) -> int:
        choice = self.rng.random()
        if choice < 0.5:
            return self.rng.randint(0, 3)
        if choice < 0.85 or bulky:
            return self.rng.randint(4, 40)
        return self.rng.choice((1000, 20_000))

    def _fill_repeated(self, msg: Message, field: FieldDescriptor, depth: int) -> None:
        target = getattr(msg, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 4:
                return
            for _ in range(min(self._count(bulky=True), self._messages)):
                self._messages -= 1
                self._fill(target.add(), depth + 1)
        else:
            n = self._count(bulky=False)
            if n > 40:  # long runs of small values, not of huge ones
                target.extend([self._small_scalar(field)] * n)
            else:
                target.extend(self.scalar(field) for _ in range(n))

    def _fill_map(self, msg: Message, field: FieldDescriptor, depth: int) -> None:
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        target = getattr(msg, field.name)
        n = self._count(bulky=value_field.type == FieldDescriptor.TYPE_MESSAGE)
        if n > 40:  # a long run of small scalar values (a map of messages is bulky: <= 40)
            value = self._small_scalar(value_field)
            target.update(dict.fromkeys(self._numbered(key_field, n), value))
            return
        for _ in range(n):
            key = self.scalar(key_field)
            if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                if depth < 4:
                    self._fill(target[key], depth + 1)
            else:
                target[key] = self.scalar(value_field)

    def _numbered(self, field: FieldDescriptor, n: int) -> tuple[Any, ...]:
        return _numbered_keys(field.type, n)

    def _small_scalar(self, field: FieldDescriptor) -> Any:
        if field.type == FieldDescriptor.TYPE_STRING:
            return "x"
        if field.type == FieldDescriptor.TYPE_BYTES:
            return b"x"
        if field.type == FieldDescriptor.TYPE_ENUM:
            return 0
        if field.type == FieldDescriptor.TYPE_BOOL:
            return True
        if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return float("nan")
        return 1

    def _huge_ok(self) -> bool:
        if self._budget >= HUGE and self.rng.random() < 0.15:
            self._budget -= HUGE
            return True
        return False

    def scalar(self, field: FieldDescriptor) -> Any:
        rng = self.rng
        t = field.type
        if t == FieldDescriptor.TYPE_STRING:
            if self._huge_ok():
                return rng.choice(("x", "é", "1.")) * HUGE
            if rng.random() < 0.2:
                return rng.randbytes(28).hex()
            return rng.choice(STRINGS)
        if t == FieldDescriptor.TYPE_BYTES:
            if self._huge_ok():
                return b"\xff" * HUGE
            roll = rng.random()
            if roll < 0.5:
                return rng.choice(self.ids[rng.choice((4, 16, 18, 28))])
            if roll < 0.6:
                return b"\xff" * 28
            return rng.randbytes(rng.choice((0, 1, 3, 29, 100, 5000)))
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return rng.choice(DOUBLES)
        if t == FieldDescriptor.TYPE_BOOL:
            return rng.random() < 0.5
        if t == FieldDescriptor.TYPE_ENUM:
            numbers = [v.number for v in field.enum_type.values]
            return rng.choice((*numbers, -1, 99, 2**31 - 1))
        return rng.choice(INTS[_INT_KIND[t]])


@functools.cache
def _numbered_keys(field_type: int, n: int) -> tuple[Any, ...]:
    """Map keys 0..n-1 in a field's type (a long map has 1,000 or 20,000 of them: built
    once, not for each of the ~800 long maps of a run)."""
    if field_type == FieldDescriptor.TYPE_STRING:
        return tuple(f"k{i}" for i in range(n))
    if field_type == FieldDescriptor.TYPE_BYTES:
        return tuple(b"k%d" % i for i in range(n))
    return tuple(range(n))


def malformed(rng: random.Random, valid: bytes) -> bytes:
    kind = rng.randrange(4)
    if kind == 0 or not valid:
        return rng.randbytes(rng.choice((1, 2, 7, 64, 4096)))
    if kind == 1:  # truncated
        return valid[: rng.randrange(len(valid))]
    if kind == 2:  # bit flips
        data = bytearray(valid)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return bytes(data)
    # a length-delimited field claiming more bytes than follow, or invalid UTF-8 in a string
    return rng.choice((b"\x0a\x64", b"\x0a\x03\xff\xfe\xfd", b"\x12\x02\xc3\x28", b"\x08"))


def wide(cls: Any) -> bytes | None:
    """A request of ~OVERSIZED bytes of empty sub-messages in its first repeated message
    field (None when it has none)."""
    for field in cls.DESCRIPTOR.fields:
        repeated_message = field.is_repeated and field.type == FieldDescriptor.TYPE_MESSAGE
        if repeated_message and field.number < 16:  # a one-byte tag
            return bytes([(field.number << 3) | 2, 0]) * (OVERSIZED // 2)
    return None


def requests_for(method: Method, rng: random.Random, values: HostileValues) -> Iterator[bytes]:
    oversized = wide(method.request_cls)
    if oversized is not None:
        yield oversized
    for _ in range(HOSTILE_PER_METHOD):
        yield values.message(method.request_cls).SerializeToString()
    for _ in range(MALFORMED_PER_METHOD):
        base = values.message(method.request_cls).SerializeToString()
        yield malformed(rng, base[:8192])


def vm_bytes(pid: int, name: str = "VmRSS") -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of a process."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {name} line")


FUZZ_CONFIG = """\
health:
  initial_delay_ms: 3600000
load_poll:
  period_ms: 3600000
raylet_rpc_timeout_ms: 1000
front_server: {front}
"""


# ~2,000 calls in sequence, a few of ~OVERSIZED bytes: 49 s in a run at load ~7, 255 s with
# the suite at -n 4 on a shared 2-core machine.  The deadline bounds a hang, not the speed.
@pytest.mark.timeout(1200)
@pytest.mark.parametrize("front", ["true", "false"], ids=["front", "grpc_aio"])
async def test_fuzz_every_unary_method(tmp_path: pathlib.Path, front: str) -> None:
    """With the front server on (every unary method answered natively) and off."""
    config = tmp_path / "fuzz.yaml"
    config.write_text(FUZZ_CONFIG.format(front=front))
    log_path = tmp_path / "gcs.log"
    gcs = GcsProcess(
        storage="memory://",
        extra_args=("--config", str(config)),
        log_path=str(log_path),
    ).start()
    methods = unary_methods()
    assert len(methods) >= 50, [m.path for m in methods]
    rng = random.Random(SEED)
    values = HostileValues(rng)
    bad: list[str] = []
    codes: collections.Counter[str] = collections.Counter()
    try:
        assert gcs.proc is not None
        pid = gcs.proc.pid
        async with grpc.aio.insecure_channel(
            gcs.address,
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        ) as channel:
            health = channel.unary_unary(
                "/grpc.health.v1.Health/Check", response_deserializer=lambda b: b
            )
            await health(b"", timeout=10)
            rss_before = vm_bytes(pid)

            async def send(method: Method, raw: bytes) -> None:
                long_poll = method.name in LONG_POLLS
                try:
                    await channel.unary_unary(method.path)(raw, timeout=0.3 if long_poll else 30)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as err:
                    code = err.code()
                    codes[code.name] += 1
                    if code in FORBIDDEN or (
                        code == grpc.StatusCode.DEADLINE_EXCEEDED and not long_poll
                    ):
                        bad.append(f"{method.path}: {code.name} {(err.details() or '')[:300]}")

            for method in methods:
                requests = requests_for(method, rng, values)
                if method.name in LONG_POLLS:
                    # held until their deadline: sent together, so the waits overlap
                    await asyncio.gather(*(send(method, raw) for raw in requests))
                else:
                    for raw in requests:
                        await send(method, raw)
                assert gcs.proc.poll() is None, f"server died during {method.path}"
            await health(b"", timeout=10)
            get_id = channel.unary_unary(
                method_path(svc.NODE_INFO.methods_by_name["GetClusterId"]),
                response_deserializer=lambda b: b,
            )
            assert await get_id(b"", timeout=10)
            rss_after = vm_bytes(pid)
            rss_peak = vm_bytes(pid, "VmHWM")
    finally:
        gcs.stop()
    print(f"fuzz: {sum(codes.values())} calls, codes {dict(codes)}")
    mib = 2**20
    print(
        f"fuzz: RSS {rss_before / mib:.0f} -> {rss_after / mib:.0f} MiB "
        f"(peak {rss_peak / mib:.0f} MiB)"
    )
    assert not bad, "\n".join(dict.fromkeys(bad))
    assert rss_after - rss_before < RSS_GROWTH_LIMIT_BYTES
    assert rss_peak - rss_before < RSS_PEAK_LIMIT_BYTES
