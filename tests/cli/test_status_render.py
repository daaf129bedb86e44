"""`gcs status` in people's units and words: memory as Ray prints it, a pending node that
reads as a sentence, launch failures with their reason, what no node type can hold."""

from __future__ import annotations

import pytest

from gcs.base.units import format_memory, usage_line
from gcs.cli.status import render, render_nodes
from gcs.policy.autoscaling.scheduler.types import LabelConstraint, LabelOp
from gcs.policy.autoscaling.scheduler.waiting import WaitingDemand, WaitKind, WaitReason
from gcs.proto import autoscaler_pb2

GIB = 2**30


class TestRaysUnits:
    @pytest.mark.parametrize(
        ("amount", "text"),
        [
            (0, "0B"),
            (1, "1B"),
            (1023, "1023B"),
            (1024, "1.00KiB"),
            (2**30 + 1, "1.00GiB"),
            (16262844416, "15.15GiB"),
            (3 * 2**40, "3.00TiB"),
        ],
    )
    def test_format_memory_matches_ray(self, amount: float, text: str) -> None:
        """Ray 2.60's format_memory: largest unit reached, two decimals, bytes below 1 KiB."""
        assert format_memory(amount) == text

    def test_usage_lines(self) -> None:
        assert usage_line("memory", 0, 16262844416) == "0B/15.15GiB memory"
        assert (
            usage_line("object_store_memory", 2**29, 2**31)
            == "512.00MiB/2.00GiB object_store_memory"
        )
        assert usage_line("CPU", 2, 16) == "2.0/16.0 CPU"


def _reply() -> autoscaler_pb2.GetClusterStatusReply:
    reply = autoscaler_pb2.GetClusterStatusReply()
    node = reply.cluster_resource_state.node_states.add(
        node_id=b"\x01" * 28, ray_node_type_name="cpu4", status=autoscaler_pb2.RUNNING
    )
    node.total_resources.update({"CPU": 16.0, "memory": 16262844416.0})
    node.available_resources.update({"CPU": 16.0, "memory": 16262844416.0})
    scaling = reply.autoscaling_state
    scaling.autoscaler_state_version = 4
    scaling.pending_instances.add(
        ray_node_type_name="cpu4",
        instance_id="i-7",
        details="waiting for Ray to start on cloud instance local-cpu4-ab12",
    )
    scaling.pending_instances.add(
        ray_node_type_name="gpu1", ip_address="10.0.0.5", details="installing Ray on its host"
    )
    for ts in (100, 160):
        scaling.failed_instance_requests.add(
            ray_node_type_name="gpu1",
            count=1,
            reason="capacity exhausted: all 3 gpu1 instances of the cloud are in use",
            failed_ts=ts,
        )
    scaling.infeasible_resource_requests.add(resources_bundle={"FOO": 1.0})
    scaling.infeasible_resource_requests.add(resources_bundle={"FOO": 1.0})
    return reply


class TestRender:
    def test_memory_usage_reads_like_ray_status(self) -> None:
        """It printed 0.0/16262844416.0 memory."""
        text = render(_reply(), now_s=0)
        assert " 0B/15.15GiB memory" in text.splitlines()
        assert " 0.0/16.0 CPU" in text.splitlines()
        assert "0.0/16262844416.0" not in text

    def test_a_pending_node_without_an_ip_is_a_sentence(self) -> None:
        """It printed `?: cpu4, allocated cloud instance local-cpu4-...`."""
        lines = render(_reply(), now_s=0).splitlines()
        assert (
            " cpu4 (no IP yet): waiting for Ray to start on cloud instance local-cpu4-ab12" in lines
        )
        assert " 10.0.0.5: gpu1, installing Ray on its host" in lines  # Ray's form
        assert not any(line.startswith(" ?:") for line in lines)

    def test_launch_failures_say_why(self) -> None:
        """Ray's `type: LaunchFailed (latest_attempt: ...)`, with the count and the reason."""
        (line,) = [x for x in render(_reply(), now_s=0).splitlines() if "LaunchFailed" in x]
        assert line.startswith(" gpu1: LaunchFailed (latest_attempt: ")
        assert line.endswith(
            ", 2 failed) - capacity exhausted: all 3 gpu1 instances of the cloud are in use"
        )

    def test_without_verdicts_ray_s_list_is_not_called_infeasible(self) -> None:
        """Ray's infeasible list counts demand a limit stopped too: with no verdict from our
        autoscaler (Ray's own runs), it is not called "no node type fits"."""
        text = render(_reply(), now_s=0)
        assert "Not placeable by the autoscaler (no node type fits, or a limit is reached):" in text
        assert "no node type fits; they wait" not in text
        assert " {FOO: 1}: 2 pending tasks/actors" in text

    def test_verdicts_tell_capped_from_infeasible(self) -> None:
        """The demo printed `Infeasible (no node type fits ...): {CPU: 1, GPU: 1}` while gpu1
        fitted it and was only at its max_workers."""
        waiting = (
            WaitingDemand(WaitKind.TASKS, {"FOO": 1}, 2, WaitReason.INFEASIBLE, "no type has FOO"),
            WaitingDemand(
                WaitKind.TASKS, {"CPU": 1, "GPU": 1}, 3, WaitReason.CAPPED, "gpu1 is at max 1"
            ),
            WaitingDemand(
                WaitKind.TASKS, {"CPUS": 1}, 1, WaitReason.INFEASIBLE, "no CPUS", "team-a"
            ),
            WaitingDemand(
                WaitKind.TASKS,
                {"TPU": 1},
                1,
                WaitReason.INFEASIBLE,
                "no TPU",
                selectors=((LabelConstraint("zone", LabelOp.IN, ("a", "b")),),),
            ),
        )
        lines = render(_reply(), now_s=0, waiting=waiting).splitlines()
        infeasible = lines.index(
            "Infeasible (no node type fits; they wait until the cluster config changes):"
        )
        capped = lines.index(
            "Capped (a node type fits but a limit stops the launch; they run when capacity frees):"
        )
        assert lines[infeasible + 1 : capped] == [
            " {FOO: 1}: 2 pending tasks/actors - no type has FOO",
            " {CPUS: 1}: 1 pending tasks/actors [virtual cluster team-a] - no CPUS",
            " {TPU: 1} [zone in (a,b)]: 1 pending tasks/actors - no TPU",
        ]
        assert lines[capped + 1] == " {CPU: 1, GPU: 1}: 3 pending tasks/actors - gpu1 is at max 1"

    def test_per_node_memory_too(self) -> None:
        assert "  0B/15.15GiB memory" in render_nodes(_reply()).splitlines()
