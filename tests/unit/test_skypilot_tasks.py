"""The SkyPilot task of one worker (echo2.launch.sky_task), checked by SkyPilot's own parser
(`sky.Task.from_yaml_config`): spot alternatives on two clouds, a Kubernetes context, the
coordinator's echo2 installed and `echo2 worker` started under the decided id, the join token
only in the task's secrets, and class configs that fail with the field and the fix.

The SkyPilot tests skip where SkyPilot is not installed: `make test-skypilot` runs them in its
own venv (SkyPilot 0.14 pins click below the version the main venv's huggingface_hub needs). The
example catalog's test needs no SkyPilot and runs everywhere."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from echo2.config.base import validate
from echo2.config.catalog import PlanConfig, WorkerClass, load_plan_config
from echo2.config.skypilot import SkyPilotClass
from echo2.config.worker import WorkerConfig
from echo2.launch.sky_task import check_classes, cluster_name, task_for, worker_toml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "catalog" / "skypilot_example.toml"
TOKEN = "s3cret-join-token-4d1f"
URL = "https://coordinator.example:8470"
SKIP_REASON = "SkyPilot is not installed here: `make test-skypilot` runs these in .venv-skypilot"


@pytest.fixture
def sky():
    return pytest.importorskip("sky", reason=SKIP_REASON)


def worker_class(skypilot: dict, price: float = 0.45) -> WorkerClass:
    return WorkerClass.model_validate({"price_per_hour": price, "count": 4, "tokens_per_s": 600,
                                       "bandwidth_bps": 1e9, "skypilot": skypilot})


SPOT_TWO_CLOUDS = {"use_spot": True, "disk_size_gb": 100,
                   "any_of": [{"accelerators": "A10G:1", "infra": "aws/us-east-1"},
                              {"accelerators": "L4:1", "infra": "gcp"}]}


def test_spot_alternatives_on_two_clouds_parse_with_skypilot(sky):
    task = task_for("w-7", "g24_spot", worker_class(SPOT_TWO_CLOUDS), coordinator_url=URL,
                    echo2_spec="echo2==0.1.0", worker_fields={}, auth_token=TOKEN)
    assert isinstance(task, sky.Task)
    by_cloud = {str(r.cloud): r for r in task.resources}
    assert set(by_cloud) == {"AWS", "GCP"}, task.resources
    assert by_cloud["AWS"].accelerators == {"A10G": 1} and by_cloud["AWS"].region == "us-east-1"
    assert by_cloud["GCP"].accelerators == {"L4": 1} and by_cloud["GCP"].region is None
    assert all(r.use_spot and r.disk_size == 100 for r in task.resources)
    assert 'uv pip install --quiet --python "$HOME/.echo2/venv/bin/python" echo2==0.1.0' in task.setup
    assert f"echo2\" worker --coordinator {URL} --config" in task.run


def test_a_kubernetes_context_parses_with_skypilot(sky):
    cls = worker_class({"infra": "k8s/my-gpu-cluster", "accelerators": ["L40S:1", "L4:1"],
                        "image_id": "docker:nvidia/cuda:12.4.1-runtime-ubuntu22.04"})
    task = task_for("w-0", "k8s_gpu", cls, coordinator_url=URL, echo2_spec="echo2==0.1.0", worker_fields={})
    assert {str(r.cloud) for r in task.resources} == {"Kubernetes"}
    assert {r.region for r in task.resources} == {"my-gpu-cluster"}  # the context
    assert {next(iter(r.accelerators)) for r in task.resources} == {"L40S", "L4"}
    assert isinstance(task.resources, set)  # any of them; in_order gives SkyPilot's ordered list
    ordered = worker_class({"accelerators": ["H100:1", "A100:1"], "in_order": True})
    in_order = task_for("w-0", "big", ordered, coordinator_url=URL, echo2_spec="echo2==0.1.0", worker_fields={})
    assert [next(iter(r.accelerators)) for r in in_order.resources] == ["H100", "A100"]


def test_the_token_is_a_secret_and_nowhere_else(sky, tmp_path):
    wheel = tmp_path / "echo2-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel")
    task = task_for("w-1", "g24_spot", worker_class(SPOT_TWO_CLOUDS), coordinator_url=URL,
                    echo2_spec=str(wheel), worker_fields={"engine": "vllm", "vllm": {"max_model_len": 4096}},
                    auth_token=TOKEN)
    assert task.secrets["ECHO2_AUTH_TOKEN"].get_secret_value() == TOKEN
    from sky.utils import yaml_utils

    shown = yaml_utils.dump_yaml_str(task.to_yaml_config(use_user_specified_yaml=True))  # what SkyPilot stores
    without_secrets = {k: v for k, v in task.to_yaml_config().items() if k != "secrets"}
    for text in (shown, yaml_utils.dump_yaml_str(without_secrets), task.run, task.setup, str(task.envs)):
        assert TOKEN not in text
    assert task.file_mounts == {f"~/.echo2/wheels/{wheel.name}": str(wheel.resolve())}  # the wheel is shipped
    assert f'"$HOME/.echo2/wheels/{wheel.name}"' in task.setup


def test_the_workers_toml_is_a_valid_worker_config_under_the_decided_id(sky):
    task = task_for("w-1", "g24_spot", worker_class(SPOT_TWO_CLOUDS, price=0.45), coordinator_url=URL,
                    echo2_spec="echo2==0.1.0", worker_fields={"engine": "vllm", "vllm": {"max_model_len": 4096}},
                    auth_token=TOKEN)
    body = re.search(r"<<'ECHO2_WORKER_TOML'\n(.*?)\nECHO2_WORKER_TOML\n", task.run, re.S)
    assert body is not None, task.run
    config = validate(WorkerConfig, tomllib.loads(body.group(1)))
    assert (config.worker_id, config.worker_class, config.price_per_hour) == ("w-1", "g24_spot", 0.45)
    assert config.engine == "vllm" and config.vllm.max_model_len == 4096 and config.auth_token == ""
    assert task.envs["ECHO2_WORKER_ID"] == "w-1"


def test_a_bad_class_config_says_the_field_and_the_fix(sky):
    catalog = tomllib.loads(EXAMPLE.read_text())
    catalog["workers"]["g24_spot"]["skypilot"] = {"accelerators": ["A10G x1"], "use_spot": True}
    with pytest.raises(ValueError, match=r"workers\.g24_spot\.skypilot\.accelerators: .*'A10G x1' is not an "
                                         r"accelerator: write NAME:COUNT"):
        validate(PlanConfig, catalog)
    catalog["workers"]["g24_spot"]["skypilot"] = {"accelerators": ["L4:1"], "infra": "aws",
                                                  "any_of": [{"accelerators": "L4:1"}]}
    with pytest.raises(ValueError, match="give exactly one of accelerators .* or any_of"):
        validate(PlanConfig, catalog)
    # past echo2's checks, SkyPilot's parser refuses an infra it does not know: named with the fix
    refused = worker_class({"accelerators": ["L4:1"], "infra": "nocloud/us-east-1"})
    with pytest.raises(ValueError, match=r"worker class 'l4': SkyPilot refuses \[workers\.l4\.skypilot\]: .*infra"
                                         r".*`sky check`"):
        task_for("w-0", "l4", refused, coordinator_url=URL, echo2_spec="echo2==0.1.0", worker_fields={})


def test_token_and_worker_fields_are_checked_before_a_machine_is_asked_for():
    cls = worker_class(SPOT_TWO_CLOUDS)
    with pytest.raises(ValueError, match="as a SkyPilot secret, never in the worker's TOML"):
        worker_toml("w-0", "g24_spot", cls, {"auth_token": TOKEN})
    with pytest.raises(ValueError, match="engin"):
        worker_toml("w-0", "g24_spot", cls, {"engin": "vllm"})
    no_table = WorkerClass.model_validate({"price_per_hour": 1, "count": 1, "tokens_per_s": 1, "bandwidth_bps": 1})
    with pytest.raises(ValueError, match=r"'plain' has no \[workers\.plain\.skypilot\] table"):
        check_classes({"plain": no_table}, {"w-0": "plain"}, {})
    with pytest.raises(ValueError, match="'gone' is not in the catalog"):
        check_classes({"g24_spot": cls}, {"w-0": "g24_spot"}, {"g24_spot": ["gone"]})


def test_cluster_names_follow_skypilot_rules_and_never_collide(sky):
    from sky.utils import common_utils

    names = {cluster_name("run-2026-05-01_12:00", w) for w in ("W_1.a", "w-1-a", "w_1_a", "x" * 80, "7up")}
    assert len(names) == 5
    for name in names:
        common_utils.check_cluster_name_is_valid(name)
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 42, name
    assert cluster_name("r", "w") == cluster_name("r", "w")  # derived, so a restarted launcher finds it


def test_the_skypilot_example_catalog_loads():
    plan = load_plan_config(EXAMPLE)
    tables = {name: cls.skypilot for name, cls in plan.workers.items()}
    assert all(isinstance(t, SkyPilotClass) for t in tables.values()), tables
    spot_infra = {alt.infra for t in tables.values() if t.use_spot for alt in t.any_of} | {
        t.infra for t in tables.values() if t.use_spot and t.infra}
    assert {i.split("/")[0] for i in spot_infra if i} >= {"aws", "gcp"}  # spot on two clouds
    assert any((t.infra or "").startswith("k8s/") for t in tables.values())  # and a Kubernetes context


def test_every_example_class_builds_a_task(sky):
    plan = load_plan_config(EXAMPLE)
    for name, cls in plan.workers.items():
        task = task_for("w-0", name, cls, coordinator_url=URL, echo2_spec="echo2==0.1.0", worker_fields={})
        assert task.resources, name
