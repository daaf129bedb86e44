"""Label selector parsing and the hand-spliced wire encoding."""

from __future__ import annotations

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import given
from hypothesis import strategies as st

from gcs.base.labels import label_selector_error, selector_proto
from gcs.base.protowire import int_field, len_field, varint
from gcs.proto import autoscaler_pb2, common_pb2

IN, NOT_IN = common_pb2.LABEL_OPERATOR_IN, common_pb2.LABEL_OPERATOR_NOT_IN


class TestLabelSelectors:
    @pytest.mark.parametrize(
        ("raw", "op", "values"),
        [
            ("a", IN, ["a"]),
            ("in(a,b)", IN, ["a", "b"]),
            ("!a", NOT_IN, ["a"]),
            ("!in(a,b)", NOT_IN, ["a", "b"]),
            ("in(a,a,b)", IN, ["a", "b"]),
            ("", IN, [""]),
        ],
    )
    def test_ray_selector_syntax(self, raw, op, values) -> None:
        """Ray's selector forms map to IN / NOT_IN with their values, as Ray sends them."""
        (constraint,) = selector_proto({"zone": raw}).label_constraints
        assert constraint.label_key == "zone" and constraint.operator == op
        assert list(constraint.label_values) == values

    @pytest.mark.parametrize("raw", ["in(a,)", "!!a", "a b"])
    def test_malformed_values_are_named(self, raw) -> None:
        """Values outside Ray's grammar get Ray's message naming the value."""
        assert raw in (label_selector_error({"zone": raw}) or "")


class TestWireEncoding:
    @given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
    def test_varint_field_parses_as_int64(self, value: int) -> None:
        """Our varint encoding round-trips through protobuf's own parser for int64."""
        data = int_field(9, value)
        parsed = autoscaler_pb2.NodeState.FromString(data)
        assert parsed.idle_duration_ms == value

    @given(st.text(max_size=300), st.integers(min_value=0, max_value=2**40))
    def test_spliced_message_equals_built_message(self, text: str, version: int) -> None:
        """Splicing cached bytes + scalar fields yields the same message protobuf builds."""
        static = autoscaler_pb2.NodeState(instance_id=text).SerializeToString()
        spliced = static + int_field(7, version)
        built = autoscaler_pb2.NodeState(instance_id=text, node_state_version=version)
        assert autoscaler_pb2.NodeState.FromString(spliced) == built
        wrapped = len_field(3, spliced)
        state = autoscaler_pb2.ClusterResourceState.FromString(wrapped)
        assert state.node_states[0] == built

    def test_small_varints(self) -> None:
        """The single-byte fast path agrees with the general case."""
        assert varint(0) == b"\x00" and varint(127) == b"\x7f" and varint(128) == b"\x80\x01"

    @pytest.mark.parametrize(
        "edge", [0, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**63 - 1]
    )
    def test_table_and_fast_paths_agree_with_protobuf(self, edge: int) -> None:
        """The table (1-2 bytes) and the three-byte branch encode as protobuf does, at every
        boundary between them."""
        for value in {max(0, edge - 1), edge, min(2**63 - 1, edge + 1)}:
            assert varint(value) == _VarintBytes(value), value


class TestDoubleMap:
    @given(st.dictionaries(st.text(max_size=20), st.floats(allow_nan=False), max_size=8))
    def test_hand_encoded_map_parses_like_protobufs(self, values) -> None:
        """Our map<string,double> bytes parse to exactly the map protobuf would hold."""
        from gcs.base.protowire import DoubleMapEncoder

        parsed = autoscaler_pb2.NodeState.FromString(DoubleMapEncoder().encode(4, values))
        assert dict(parsed.available_resources) == values

    @given(st.lists(st.dictionaries(st.text(max_size=20), st.floats(allow_nan=False), max_size=8)))
    def test_encoder_with_remembered_prefixes_matches(self, maps) -> None:
        """The encoder's remembered prefixes give the same bytes as encoding afresh, also once
        its bound is reached."""
        from gcs.base.protowire import DoubleMapEncoder

        encoder = DoubleMapEncoder(max_keys=4)
        for values in maps + maps:
            assert encoder.encode(5, values) == DoubleMapEncoder().encode(5, values)
        assert len(encoder) <= 4
