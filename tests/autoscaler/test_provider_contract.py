"""The provider contract (``gcs.autoscaler.providers.base``), run on every provider.

Each rig (``provider_rigs``) stands the provider's cloud in; the recording fake of
``gcs.testing.cloud`` is the reference.  A provider added to the registry without a rig
fails ``test_every_registered_provider_has_a_rig``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gcs.autoscaler.config import ConfigError, parse_cluster_config
from gcs.autoscaler.model import NodeKind
from gcs.autoscaler.providers.base import (
    Capabilities,
    CloudInstance,
    CloudUnavailable,
    LaunchNodeError,
    ProviderContext,
    TerminateNodeError,
    provider_factory,
)
from gcs.autoscaler.providers.registry import PROVIDERS
from gcs.testing.cloud import FakeAutoscalerGcs
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.kuberay_harness import KubeRayHarness, raycluster, worker_group
from tests.autoscaler.provider_rigs import RIGS, Rig
from tests.autoscaler.toy_provider import TOY_PROVIDERS


@pytest.fixture(params=sorted(RIGS))
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    made = RIGS[request.param](tmp_path)
    try:
        yield made
    finally:
        await made.close()


async def listing(rig: Rig) -> dict[str, CloudInstance]:
    return dict(await rig.provider.get_non_terminated())


async def launched(rig: Rig, count: int, request_id: str) -> dict[str, CloudInstance]:
    """Launch ``count`` of the rig's type; the instances that appeared."""
    before = await listing(rig)
    await rig.provider.launch({rig.node_type: count}, request_id)
    return {cid: ci for cid, ci in (await listing(rig)).items() if cid not in before}


def read_only(rig: Rig) -> bool:
    return rig.provider.capabilities.read_only


class TestRegistry:
    def test_every_registered_provider_has_a_rig(self) -> None:
        """The reference fake plus every registry row (the toy's included) has a rig."""
        assert set(RIGS) == {"fake", *TOY_PROVIDERS}

    async def test_every_row_builds_a_provider_that_declares_its_capabilities(
        self, tmp_path: Path
    ) -> None:
        cluster = parse_cluster_config(
            {
                "provider": {"type": "command"},
                "head_node_type": "head",
                "available_node_types": {
                    "head": {"resources": {}, "node_config": {"start_command": "true"}},
                    "cpu": {"resources": {"CPU": 1}, "node_config": {"start_command": "true"}},
                },
            },
            providers=TOY_PROVIDERS,
        )
        k8s = KubeRayHarness(raycluster(worker_group()))
        try:
            context = ProviderContext(
                cluster=cluster,
                gcs_address="127.0.0.1:1",
                gcs=FakeAutoscalerGcs(),
                clock=SteppedClock(),
                state_dir=tmp_path,
                kube_api=k8s.api,
            )
            for name in TOY_PROVIDERS:
                provider = provider_factory(name, TOY_PROVIDERS)(context)
                assert isinstance(provider.capabilities, Capabilities), name
        finally:
            k8s.stop()

    def test_declared_capabilities(self) -> None:
        """What each production provider declares (nothing is guessed from its type)."""
        assert sorted(PROVIDERS) == ["command", "kuberay", "local", "read-only"]
        from gcs.autoscaler.providers.local import LocalProvider
        from gcs.autoscaler.providers.read_only import ReadOnlyProvider

        assert LocalProvider.capabilities == Capabilities(starts_head=True, ends_with_server=True)
        assert ReadOnlyProvider.capabilities == Capabilities(read_only=True)

    def test_an_unregistered_provider_type_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match=r"provider\.type: 'aws' is not supported here"):
            parse_cluster_config(
                {"provider": {"type": "aws"}, "available_node_types": {"h": {"resources": {}}}}
            )


class TestContract:
    async def test_capabilities_are_declared_by_the_provider(self, rig: Rig) -> None:
        assert isinstance(rig.provider.capabilities, Capabilities)

    async def test_launched_instances_are_listed_with_their_type(self, rig: Rig) -> None:
        new = await launched(rig, 2, "req-1")
        if read_only(rig):  # never launches
            assert new == {} and rig.provider.poll_errors() == []
            return
        assert len(new) == 2
        for cid, ci in new.items():
            assert ci.cloud_instance_id == cid and ci.node_type == rig.node_type
            assert ci.node_kind is NodeKind.WORKER and ci.is_running
            assert ci.request_id == ("req-1" if rig.tags_request_ids else "")
        assert rig.provider.poll_errors() == []

    async def test_a_launch_replayed_under_its_request_id_changes_nothing(self, rig: Rig) -> None:
        await launched(rig, 1, "req-1")
        first = await listing(rig)
        await rig.provider.launch({rig.node_type: 1}, "req-1")
        assert await listing(rig) == first
        assert rig.provider.poll_errors() == []

    async def test_terminated_instances_leave_the_listing_and_replays_change_nothing(
        self, rig: Rig
    ) -> None:
        new = await launched(rig, 2, "req-1")
        targets = sorted(new) or sorted(await listing(rig))
        await rig.provider.terminate(targets, "term-1")
        after = await listing(rig)
        if read_only(rig):  # never terminates
            assert set(targets) <= set(after)
        else:
            assert not set(targets) & set(after)
        await rig.provider.terminate(targets, "term-1")
        assert await listing(rig) == after
        assert rig.provider.poll_errors() == []

    async def test_terminating_an_unknown_instance_is_not_an_error(self, rig: Rig) -> None:
        await launched(rig, 1, "req-1")
        before = await listing(rig)
        await rig.provider.terminate(["no-such-instance"], "term-1")
        assert await listing(rig) == before
        assert rig.provider.poll_errors() == []

    async def test_an_unknown_node_type_is_reported_once_as_a_typed_launch_error(
        self, rig: Rig
    ) -> None:
        before = await listing(rig)
        await rig.provider.launch({"no-such-type": 3}, "req-x")
        errors = rig.provider.poll_errors()
        assert await listing(rig) == before
        if read_only(rig):  # reports nothing
            assert errors == []
            return
        (err,) = errors
        assert isinstance(err, LaunchNodeError)
        assert (err.node_type, err.count, err.request_id) == ("no-such-type", 3, "req-x")
        assert err.details
        assert rig.provider.poll_errors() == []

    async def test_a_failed_termination_is_reported_once_per_instance(self, rig: Rig) -> None:
        cid = await rig.launch_unterminable("req-u")
        if cid is None:
            pytest.skip(f"{rig.name}: its cloud never refuses a termination")
        await rig.provider.terminate([cid], "term-u")
        (err,) = rig.provider.poll_errors()
        assert isinstance(err, TerminateNodeError)
        assert (err.cloud_instance_id, err.request_id) == (cid, "term-u") and err.details
        assert rig.provider.poll_errors() == []

    async def test_listing_is_a_pure_read(self, rig: Rig) -> None:
        """Listing writes nothing to the cloud or the GCS, even when the last changes left
        work behind (a terminated instance, one lost behind the provider's back): that work
        belongs to the provider's upkeep step."""
        new = sorted(await launched(rig, 3, "req-1"))
        if new:
            await rig.provider.terminate(new[:1], "term-1")
            lost = await rig.lose(new[1])
        else:
            await rig.lose(sorted(await listing(rig))[-1])
        mark = rig.writes()
        first = await listing(rig)
        second = await listing(rig)
        assert rig.writes() == mark
        assert first == second
        if new:
            assert set(first) & set(new) == ({new[2]} if lost else {new[1], new[2]})

    async def test_a_cloud_that_cannot_be_read_raises_cloud_unavailable(self, rig: Rig) -> None:
        if not rig.break_listing():
            pytest.skip(f"{rig.name}: nothing stands between it and its cloud to fail")
        with pytest.raises(CloudUnavailable):
            await listing(rig)
