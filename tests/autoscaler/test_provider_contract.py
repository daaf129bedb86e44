"""The provider contract (``gcs.autoscaler.providers.base``), run on every provider.

Each rig (``provider_rigs``) stands the provider's cloud in; the recording fake of
``gcs.testing.cloud`` is the reference.  A provider added to the registry without a rig
fails ``test_every_registered_provider_has_a_rig``.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import gcs.autoscaler
from gcs.autoscaler.config import ConfigError, parse_cluster_config
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
from gcs.policy.autoscaling.model import NodeKind
from gcs.testing.cloud import FakeAutoscalerGcs
from tests.autoscaler.clock import SteppedClock
from tests.autoscaler.provider_rigs import RIGS, Rig
from tests.autoscaler.toy_provider import TOY_PROVIDERS

AUTOSCALER = Path(gcs.autoscaler.__file__).parent
REGISTERED = sorted(TOY_PROVIDERS)
"""The registry the suite runs on: every production row and the toy's."""


@pytest.fixture(params=["fake", *REGISTERED])
async def rig(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rig]:
    """The reference fake, then one rig per registry row (a row without a rig fails here)."""
    if request.param not in RIGS:
        pytest.fail(f"provider {request.param!r} is registered but has no rig (provider_rigs)")
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

    def test_declared_capabilities(self) -> None:
        """What each production provider declares (nothing is guessed from its type)."""
        assert sorted(PROVIDERS) == ["aws", "command", "kuberay", "local", "read-only"]
        from gcs.autoscaler.providers.local import LocalProvider
        from gcs.autoscaler.providers.read_only import ReadOnlyProvider

        assert LocalProvider.capabilities == Capabilities(starts_head=True, ends_with_server=True)
        assert ReadOnlyProvider.capabilities == Capabilities(read_only=True)

    def test_the_context_is_the_same_for_every_provider(self) -> None:
        """Nothing of one provider in the generic contract: KubeRay builds its API client
        from its own section (no ``kube_api`` here)."""
        assert [f.name for f in dataclasses.fields(ProviderContext)] == [
            "cluster", "gcs_address", "gcs", "clock", "state_dir", "child_env",
        ]  # fmt: skip

    def test_no_module_outside_the_providers_switches_on_a_provider_name(self) -> None:
        """Adding a provider is one file and one row: config, runtime and command lines
        read the row, they never compare ``provider.type`` with a name."""
        wrong = []
        for path in sorted(AUTOSCALER.rglob("*.py")):
            rel = path.relative_to(AUTOSCALER).as_posix()
            if rel.startswith("providers/"):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.Compare, ast.List, ast.Tuple, ast.Set, ast.Dict)):
                    names = {
                        c.value
                        for c in ast.walk(node)
                        if isinstance(c, ast.Constant) and c.value in PROVIDERS
                    }
                    wrong += [f"{rel}:{node.lineno} {name!r}" for name in sorted(names)]
        assert wrong == []

    def test_each_row_checks_its_own_keys(self) -> None:
        """A key of one provider (outside Ray's schema's common ones) is unknown to
        another; the row's section parser checks what it needs (KubeRay: the RayCluster's
        name; command: a start command)."""
        types = {"h": {"resources": {}}}
        with pytest.raises(ConfigError, match=r"^provider\.cluster_name: unknown key"):
            parse_cluster_config({"provider": {"type": "local", "cluster_name": "x"},
                                  "available_node_types": types})  # fmt: skip
        with pytest.raises(ConfigError, match=r"^provider\.cluster_name: required"):
            parse_cluster_config({"provider": {"type": "kuberay"}, "available_node_types": types})
        with pytest.raises(ConfigError, match=r"no node type has node_config\.start_command"):
            parse_cluster_config({"provider": {"type": "command"}, "available_node_types": types})
        cluster = parse_cluster_config(
            {
                "provider": {"type": "kuberay", "cluster_name": "c", "namespace": "n"},
                "available_node_types": types,
            }
        )
        assert cluster.provider.options == {"cluster_name": "c", "namespace": "n"}

    def test_an_unregistered_provider_type_is_a_config_error(self) -> None:
        with pytest.raises(ConfigError, match=r"provider\.type: 'gcp' is not supported here"):
            parse_cluster_config(
                {"provider": {"type": "gcp"}, "available_node_types": {"h": {"resources": {}}}}
            )


class TestContract:
    async def test_capabilities_are_declared_by_the_provider(self, rig: Rig) -> None:
        assert isinstance(rig.provider.capabilities, Capabilities)

    async def test_its_row_builds_it_from_a_cluster_config_by_type_name(
        self, rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The row's section parser takes the provider's own keys, its factory builds the
        provider from the generic context alone (KubeRay its API client from its section
        and the credentials), and what it built reads the rig's world."""
        if rig.name not in TOY_PROVIDERS:
            pytest.skip("the reference fake is no registry row")
        for key, value in rig.env().items():
            monkeypatch.setenv(key, value)
        node = {"resources": {"CPU": 2}, "node_config": rig.node_config}
        cluster = parse_cluster_config(
            {
                "provider": {"type": rig.name, **rig.section},
                "head_node_type": "head",
                "available_node_types": {"head": {**node, "resources": {}}, "cpu": node},
            },
            providers=TOY_PROVIDERS,
        )
        assert cluster.provider.type == rig.name
        context = ProviderContext(
            cluster=cluster,
            gcs_address="127.0.0.1:1",
            gcs=FakeAutoscalerGcs(),
            clock=SteppedClock(),
            state_dir=tmp_path / "built",
        )
        built = provider_factory(rig.name, TOY_PROVIDERS)(context)
        assert type(built) is type(rig.provider)
        assert isinstance(built.capabilities, Capabilities)
        if not rig.provider.capabilities.read_only:  # the fake GCS of ``context`` is empty
            assert set(await built.get_non_terminated()) == set(await listing(rig))

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
