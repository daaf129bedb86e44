"""``gcs vcluster`` against a running GCS (CliRunner in a worker thread)."""

from __future__ import annotations

import asyncio
import json

from click.testing import CliRunner

from gcs.cli.vcluster import vcluster


async def run(*args: str, env: dict[str, str] | None = None):
    return await asyncio.to_thread(CliRunner().invoke, vcluster, list(args), env=env)


class TestCli:
    async def test_create_update_list_show_remove(self, memory_env) -> None:
        """The CLI creates (once), updates with the revision, lists, shows and removes."""
        address = memory_env.server.address
        created = await run(
            "create",
            "--id",
            "vc1",
            "--replica-sets",
            '{"4c8g": 2}',
            "--format",
            "json",
            env={"GCS_ADDRESS": address},
        )
        assert created.exit_code == 0, created.output
        data = json.loads(created.stdout)
        assert len(data["node_instances"]) == 2 and data["revision"] > 0

        dup = await run("create", "--id", "vc1", "--address", address)
        assert dup.exit_code == 1
        assert "Failed to create virtual cluster 'vc1': already exists" in dup.output

        stale = await run(
            "update",
            "--id",
            "vc1",
            "--replica-sets",
            '{"4c8g": 1}',
            "--revision",
            "1",
            "--address",
            address,
        )
        assert stale.exit_code == 1 and "is expired" in stale.output
        updated = await run(
            "update",
            "--id",
            "vc1",
            "--replica-sets",
            '{"4c8g": 1}',
            "--revision",
            str(data["revision"]),
            "--address",
            address,
        )
        assert updated.exit_code == 0, updated.output
        assert "Virtual cluster 'vc1' updated successfully" in updated.output
        assert "revision: " in updated.output

        listed = await run("list", "--format", "json", env={"RAY_ADDRESS": address})
        rows = {r["virtual_cluster_id"]: r for r in json.loads(listed.stdout)["virtual_clusters"]}
        assert rows["vc1"]["replica_sets"] == {"4c8g": 1}
        assert "kPrimaryClusterID" in rows
        table = await run("list", "--address", address)
        assert table.stdout.splitlines()[0].startswith("VIRTUAL_CLUSTER_ID")

        shown = await run("show", "vc1", "--address", address)
        assert "revision: " in shown.output and "4c8g" in shown.output
        by_option = await run("show", "--id", "vc1", "--address", address)
        assert by_option.exit_code == 0 and by_option.stdout == shown.stdout

        removed = await run("remove", "--id", "vc1", "--address", address)
        assert removed.exit_code == 0
        assert "Virtual cluster 'vc1' removed successfully" in removed.output
        missing = await run("remove", "vc1", "--address", address)
        assert missing.exit_code == 1 and "does not exist" in missing.output
