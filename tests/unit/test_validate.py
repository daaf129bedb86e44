"""gcs.services.validate: pure checks; every error names the field and quotes at most a short
prefix."""

from __future__ import annotations

import math

import pytest

from gcs.base.errors import InvalidArgument
from gcs.config import RequestLimits
from gcs.proto import autoscaler_pb2 as A
from gcs.proto import common_pb2
from gcs.services import validate

LIMITS = RequestLimits()


def invalid(fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument) as err:
        fn(*args, **kwargs)
    return err.value.message


class TestHost:
    @pytest.mark.parametrize(
        "address",
        [
            "127.0.0.1",
            "10.0.0.7",
            "192.168.1.20",
            "::1",
            "fe80::1",
            "2001:db8::8a2e:370:7334",
            "localhost",
            "node-1.cluster.local",
            "ip-10-0-0-1.ec2.internal.",
            "worker_3",
            "a" * 63 + "." + "b" * 63,
        ],
    )
    def test_ip_literals_and_host_names_pass(self, address: str) -> None:
        """Non-loopback addresses are allowed: real clusters span machines."""
        assert validate.host(address, "addr", 253) == address

    @pytest.mark.parametrize(
        ("address", "needle"),
        [
            ("", "addr is required"),
            ("x" * 254, "longer than 253 bytes"),
            ("a" * 64 + ".example", "IP address or a host name"),
            ("http://h", "no scheme"),
            ("h:80", "IP address or a host name"),
            ("h/p", "IP address or a host name"),
            ("[::1]", "IP address or a host name"),
            ("a..b", "IP address or a host name"),
            (".", "IP address or a host name"),
            ("-a", "IP address or a host name"),
            ("a-", "IP address or a host name"),
            ("a\x00b", "IP address or a host name"),
            ("ü.de", "IP address or a host name"),
            ("0.0.0.0", "unicast"),
            ("::", "unicast"),
            ("239.1.2.3", "unicast"),
            ("1.2.3.999", "not a valid IP address"),
            ("10.1", "not a valid IP address"),
        ],
    )
    def test_garbage_is_rejected(self, address: str, needle: str) -> None:
        message = invalid(validate.host, address, "addr", 253)
        assert message.startswith("addr ")
        assert needle in message

    def test_huge_values_are_quoted_short(self) -> None:
        message = invalid(validate.host, "x" * 1_000_000, "addr", 253)
        assert len(message) < 200


class TestAmounts:
    @pytest.mark.parametrize("amount", [math.inf, -math.inf, math.nan, -1.0, -1e-9, 1e16])
    def test_bad_amounts(self, amount: float) -> None:
        assert "f[CPU]" in invalid(validate.resource_map, {"CPU": amount}, "f", LIMITS)

    def test_good_amounts(self) -> None:
        values = {"CPU": 0.0, "memory": 2.5e14, "GPU": 0.0001}
        assert validate.resource_map(values, "f", LIMITS) == values

    def test_map_size_and_names(self) -> None:
        small = RequestLimits(max_map_entries=2, max_name_bytes=8)
        assert "limit is 2" in invalid(validate.resource_map, {"a": 1, "b": 1, "c": 1}, "f", small)
        assert "f resource name" in invalid(validate.resource_map, {"n" * 9: 1}, "f", small)
        assert "empty resource name" in invalid(validate.resource_map, {"": 1}, "f", small)

    def test_amounts_in_walks_nested_messages(self) -> None:
        state = A.AutoscalingState(
            infeasible_gang_resource_requests=[
                A.GangResourceRequest(
                    requests=[
                        A.ResourceRequest(resources_bundle={"CPU": 1}),
                        A.ResourceRequest(resources_bundle={"GPU": math.inf}),
                    ]
                )
            ]
        )
        message = invalid(validate.amounts_in, state, "s")
        assert "s.infeasible_gang_resource_requests[0].requests[1].resources_bundle[GPU]" in message


class TestSizes:
    def test_text_counts_utf8_bytes(self) -> None:
        assert validate.text("é" * 4, "f", 8) == "é" * 4
        assert "longer than 7 bytes" in invalid(validate.text, "é" * 4, "f", 7)

    def test_required_and_blob(self) -> None:
        assert "f is required" in invalid(validate.text, "", "f", 8, required=True)
        assert "f is 9 bytes; the limit is 8" in invalid(validate.blob, b"x" * 9, "f", 8)

    def test_fixed_id(self) -> None:
        assert validate.fixed_id(b"", "f", 4) == b""
        assert validate.fixed_id(b"abcd", "f", 4) == b"abcd"
        assert "f must be 4 bytes, got 5" in invalid(validate.fixed_id, b"abcde", "f", 4)

    def test_labels(self) -> None:
        assert validate.label_map({"ray.io/a": "b"}, "l", LIMITS) == {"ray.io/a": "b"}
        assert "l key" in invalid(validate.label_map, {"k" * 318: "v"}, "l", LIMITS)
        assert "l[k]" in invalid(validate.label_map, {"k": "v" * 257}, "l", LIMITS)
        many = {f"k{i}": "v" for i in range(257)}
        assert "limit is 256" in invalid(validate.label_map, many, "l", LIMITS)

    def test_strings_in_names_the_path(self) -> None:
        spec = common_pb2.PlacementGroupSpec(
            bundles=[common_pb2.Bundle(), common_pb2.Bundle(label_selector={"k": "v" * 10})]
        )
        message = invalid(validate.strings_in, spec, "spec", 8)
        assert "spec.bundles[1].label_selector[k]" in message
        assert validate.strings_in(spec, "spec", 10) is spec

    def test_record_and_entries(self) -> None:
        spec = common_pb2.PlacementGroupSpec(name="n" * 100)
        assert "spec is 102 bytes encoded" in invalid(validate.record, spec, "spec", 50)
        assert "xs has 3 entries" in invalid(validate.entries, [1, 2, 3], "xs", 2)
        assert "-1" in invalid(validate.non_negative, -1, "n")
