"""The autoscaler explains itself: plan reasons a person can act on (raw scores behind -v),
verdicts on demand it cannot place, and disruption limits set from the cluster config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from google.protobuf import json_format

from gcs.autoscaler.config import ConfigError, parse_cluster_config
from gcs.autoscaler.providers.kuberay.cluster import cluster_config
from gcs.autoscaler.providers.kuberay.ippr import IpprConfig
from gcs.cli.autoscaler import autoscaler
from gcs.policy.autoscaling.scheduler import schedule
from gcs.proto import autoscaler_pb2
from tests.autoscaler.builders import inp, ntype, running

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp: Path, shapes: list[tuple[dict[str, float], int]], *extra: str) -> str:
    state = autoscaler_pb2.ClusterResourceState()
    for shape, count in shapes:
        state.pending_resource_requests.add(count=count).request.resources_bundle.update(shape)
    path = tmp / "state.json"
    path.write_text(json_format.MessageToJson(state))
    args = ["plan", "--config", str(ROOT / "examples" / "cluster.yaml"), "--state", str(path)]
    result = CliRunner().invoke(autoscaler, [*args, *extra])
    assert result.exit_code == 0, result.output
    return result.stdout


class TestPlanReasons:
    def test_the_only_type_with_a_gpu(self, tmp_path: Path) -> None:
        """A GPU request: gpu1 is picked because nothing else has a GPU (it used to read
        "best score label score 1, 2 matching resource types, min util 1, avg util 2.5")."""
        out = _plan(tmp_path, [({"GPU": 1, "CPU": 1}, 1)])
        assert (
            "launch 1 x gpu1: 1 pending {CPU:1, GPU:1} requests; gpu1 chosen: the only "
            "node type with GPU" in out
        )
        assert "util" not in out and "score" not in out

    def test_a_cpu_request_keeps_the_gpu_node_free(self, tmp_path: Path) -> None:
        out = _plan(tmp_path, [({"CPU": 1}, 1)])
        assert "cpu4 chosen: gpu1 would leave its GPU idle for non-GPU work" in out

    def test_once_a_type_is_at_its_limit_the_reason_says_so(self, tmp_path: Path) -> None:
        out = _plan(tmp_path, [({"CPU": 4}, 8)])
        assert "gpu1 chosen: the other types that fit are out (cpu4 is at max_workers 6)" in out

    def test_scores_only_with_v(self, tmp_path: Path) -> None:
        """The raw tuple, every term named, behind -v (and always in the JSON)."""
        plain = _plan(tmp_path, [({"CPU": 1}, 1)])
        verbose = _plan(tmp_path, [({"CPU": 1}, 1)], "-v")
        assert "scores:" not in plain
        assert "scores: cpu4: label match 0, keeps GPUs for GPU work yes" in verbose
        assert "runner-up gpu1:" in verbose
        doc = json.loads(_plan(tmp_path, [({"CPU": 1}, 1)], "--format", "json"))
        assert any("runner-up gpu1" in s for s in doc["scores"].values())

    def test_demand_no_type_fits_names_the_missing_resource(self, tmp_path: Path) -> None:
        out = _plan(tmp_path, [({"FOO": 1}, 1), ({"CPU": 1000}, 2)])
        assert "1 pending {FOO:1} requests fit no node type: no node type has FOO" in out
        assert (
            "2 pending {CPU:1000} requests fit no node type: CPU 1000 > the most any type "
            "has (4)" in out
        )

    def test_memory_in_reasons_is_in_rays_units(self) -> None:
        """{memory:16262844416} read as bytes; the reasons print Ray's 15.15GiB."""
        from gcs.policy.autoscaling.scheduler.resources import shape_text

        assert shape_text({"CPU": 1, "memory": 16262844416}) == "{CPU:1, memory:15.15GiB}"


class TestDisruptionFromConfig:
    RAW = {
        "max_workers": 10,
        "idle_timeout_minutes": 1,
        "head_node_type": "head",
        "available_node_types": {"head": {}, "cpu": {"resources": {"CPU": 4}, "max_workers": 10}},
    }

    def test_budget_and_label_reach_the_scheduler(self) -> None:
        """`disruption:` in the cluster YAML sets what were scheduler-only options: at most
        2 idle nodes go per round, and the labelled one never does."""
        cfg = parse_cluster_config(
            {**self.RAW, "disruption": {"budget": 2, "do_not_disrupt_label": "keep"}}
        )
        nodes = [running(f"n{i}", idle_s=400) for i in range(5)]
        nodes.append(running("pinned", idle_s=999, labels={"keep": "true"}))
        reply = schedule(
            inp([ntype("cpu")], nodes, options=cfg.scheduler.options, idle_timeout_s=60)
        )
        assert len(reply.terminations) == 2
        assert "pinned" not in {t.instance_id for t in reply.terminations}

    def test_a_percentage_budget(self) -> None:
        cfg = parse_cluster_config({**self.RAW, "disruption": {"budget": "25%"}})
        assert cfg.scheduler.options.disruption_budget_percent == 25

    @pytest.mark.parametrize(
        ("disruption", "message"),
        [
            ({"budget": 0}, "disruption.budget: expected a count >= 1"),
            ({"budget": "150%"}, "disruption.budget: a percentage must be in (0, 100]"),
            ({"budgets": 1}, "disruption.budgets: unknown key"),
            ({"do_not_disrupt_label": ""}, "disruption.do_not_disrupt_label: expected"),
        ],
    )
    def test_bad_values_name_the_key(self, disruption: dict, message: str) -> None:  # type: ignore[type-arg]
        with pytest.raises(ConfigError) as caught:
            parse_cluster_config({**self.RAW, "disruption": disruption})
        assert str(caught.value).startswith(message)

    def test_kuberay_reads_the_raycluster_annotations(self) -> None:
        cr = {
            "metadata": {
                "name": "rc",
                "annotations": {
                    "gcs.ray.io/disruption-budget": "20%",
                    "gcs.ray.io/do-not-disrupt-label": "team/pinned",
                },
            },
            "spec": {
                "headGroupSpec": {"rayStartParams": {"num-cpus": "0"}},
                "workerGroupSpecs": [
                    {"groupName": "w", "maxReplicas": 4, "rayStartParams": {"num-cpus": "2"}}
                ],
            },
        }
        opts = cluster_config(cr, IpprConfig(), {}).scheduler.options
        assert opts.disruption_budget_percent == 20
        assert opts.do_not_disrupt_label == "team/pinned"
        cr["metadata"]["annotations"]["gcs.ray.io/disruption-budget"] = "none"  # type: ignore[index]
        with pytest.raises(ConfigError, match=r"gcs\.ray\.io/disruption-budget"):
            cluster_config(cr, IpprConfig(), {})
