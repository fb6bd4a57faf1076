"""The deployment files agree with the code: deploy/dagster.yaml is the rendered production
instance and a valid Dagster instance config; the Helm values, the Compose file, the Kubernetes
manifests and the Dockerfile load the module that exists, set every variable the code reads,
use one image and the versions in the lock, and carry the same run-queue limits."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml

from orchestration.deployment import ENV_VARS
from orchestration.instance import COMPUTE_LOGS_BUCKET_ENV, POSTGRES_ENV, RunLimits, production_instance, render, tag_concurrency_limits
from orchestration.run_tags import FINETUNE_TAG, JOB_LIMIT_TAGS, K8S_CONFIG_TAG, RESYNC_TAG, job_tags

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CODE_MODULE = "orchestration.definitions"
SEARCHSMITH_SERVICES = ("buckets", "user-code", "webserver", "daemon", "api")


def load(name: str):
    return yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8"))


def compose() -> dict:
    return load("compose.yaml")


def helm() -> dict:
    return load("helm/values.yaml")


def k8s_objects() -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "k8s/searchsmith.yaml").read_text(encoding="utf-8")))


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text(encoding="utf-8")


def locked(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", (ROOT / "requirements.lock").read_text(), re.M)
    assert match, f"{name} is not in requirements.lock"
    return match.group(1)


def env_list(items: list[dict]) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in items}


def camel(limit: dict) -> dict:
    return {"key": limit["key"], **({"value": limit["value"]} if "value" in limit else {}), "limit": limit["limit"]}


# --- the instance file --------------------------------------------------------------------------


def test_dagster_yaml_is_the_rendered_production_instance():
    assert (DEPLOY / "dagster.yaml").read_text(encoding="utf-8") == render(), "run `python -m orchestration.instance > deploy/dagster.yaml`"


def test_dagster_yaml_is_a_valid_instance_config(tmp_path, monkeypatch):
    pytest.importorskip("dagster_postgres")
    pytest.importorskip("dagster_aws")
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._core.instance.ref import InstanceRef
    from dagster_postgres import DagsterPostgresStorage

    for variable in POSTGRES_ENV.values():
        monkeypatch.setenv(variable, "5432" if variable.endswith("PORT") else "x")
    monkeypatch.setenv(COMPUTE_LOGS_BUCKET_ENV, "searchsmith-compute-logs")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    (tmp_path / "dagster.yaml").write_text((DEPLOY / "dagster.yaml").read_text())
    config, _ = dagster_instance_config(str(tmp_path))  # the instance schema, every section
    storage = process_config(DagsterPostgresStorage.config_type(), config["storage"]["postgres"])
    assert storage.success, storage.errors
    ref = InstanceRef.from_dir(str(tmp_path))
    coordinator = ref.run_coordinator  # built from the file: no database is touched
    assert type(coordinator).__name__ == "QueuedRunCoordinator"
    assert coordinator.get_run_queue_config().tag_concurrency_limits == tag_concurrency_limits(RunLimits())
    assert type(ref.compute_log_manager).__name__ == "S3ComputeLogManager"


def test_limits_count_the_tags_the_jobs_carry():
    from orchestration.definitions import defs

    for name, tag in JOB_LIMIT_TAGS.items():
        job = defs.resolve_job_def(name)
        assert job.get_tags_for_partition_key("acme", selected_asset_keys=None)[tag] == "acme", name
    keys = {limit["key"] for limit in tag_concurrency_limits(RunLimits())}
    assert keys == {RESYNC_TAG, FINETUNE_TAG}


def test_fine_tunes_ask_kubernetes_for_gpu_nodes_and_resyncs_do_not():
    from orchestration.definitions import defs

    for name, tag in JOB_LIMIT_TAGS.items():
        tags = defs.resolve_job_def(name).tags
        if tag == FINETUNE_TAG:
            pod = json.loads(tags[K8S_CONFIG_TAG])
            assert pod["container_config"]["resources"]["requests"]["nvidia.com/gpu"] == "1"
            assert pod["pod_spec_config"]["node_selector"]
        else:
            assert K8S_CONFIG_TAG not in tags
    assert job_tags("corpus_resync") == {}


def test_limits_reject_negative_counts():
    with pytest.raises(ValueError):
        RunLimits(accelerators=-1)


# --- Helm values --------------------------------------------------------------------------------


def test_helm_runs_are_kubernetes_jobs_on_postgres_with_s3_logs():
    values = helm()
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    postgres = values["postgresql"]
    assert postgres["enabled"] is False and postgres["postgresqlHost"]
    assert postgres["postgresqlScheme"] == production_instance()["storage"]["postgres"]["postgres_db"]["scheme"]
    logs = values["computeLogManager"]
    assert logs["type"] == "S3ComputeLogManager"
    assert logs["config"]["s3ComputeLogManager"]["prefix"] == production_instance()["compute_logs"]["config"]["prefix"]
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert logs["config"]["s3ComputeLogManager"]["bucket"] == env_list(deployment["env"])[COMPUTE_LOGS_BUCKET_ENV]


def test_helm_queue_limits_are_the_instance_limits():
    queued = helm()["dagsterDaemon"]["runCoordinator"]
    assert queued["type"] == "QueuedRunCoordinator" and queued["enabled"]
    config = queued["config"]["queuedRunCoordinator"]
    assert config["maxConcurrentRuns"] == RunLimits().max_concurrent_runs
    assert config["tagConcurrencyLimits"] == [camel(limit) for limit in tag_concurrency_limits(RunLimits())]


def test_helm_user_code_loads_the_code_location_with_every_variable_set():
    import importlib.util

    (deployment,) = helm()["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    module = args[args.index("--module-name") + 1]
    assert module == CODE_MODULE and importlib.util.find_spec(module) is not None
    env = env_list(deployment["env"])
    assert set(ENV_VARS) <= set(env), set(ENV_VARS) - set(env)
    assert env["SEARCHSMITH_CHROMA_MODE"] == "http"
    mounts = {mount["mountPath"] for mount in deployment["volumeMounts"]}
    assert {env["SEARCHSMITH_HOME"], env["SEARCHSMITH_CUSTOMERS_DIR"]} <= mounts
    assert deployment["includeConfigInLaunchedRuns"]["enabled"], "run pods need the same env and volumes"


def test_helm_uses_one_image_everywhere():
    values = helm()
    images = [values["dagsterWebserver"]["image"], values["dagsterDaemon"]["image"],
              *(d["image"] for d in values["dagster-user-deployments"]["deployments"])]
    assert len({(image["repository"], image["tag"]) for image in images}) == 1
    search = next(o for o in k8s_objects() if o["kind"] == "Deployment" and o["metadata"]["name"] == "search")
    image = images[0]
    assert search["spec"]["template"]["spec"]["containers"][0]["image"] == f"{image['repository']}:{image['tag']}"


def test_dagster_home_is_the_same_in_the_image_and_the_chart():
    home = re.search(r"DAGSTER_HOME=(\S+)", dockerfile()).group(1)
    assert helm()["global"]["dagsterHome"] == home
    assert compose()["x-searchsmith-env"]["DAGSTER_HOME"] == home


# --- Kubernetes manifests -----------------------------------------------------------------------


def test_k8s_search_service_reaches_the_index_and_the_chroma_server():
    objects = {(o["kind"], o["metadata"]["name"]): o for o in k8s_objects()}
    search = objects[("Deployment", "search")]["spec"]["template"]["spec"]["containers"][0]
    env = env_list(search["env"])
    assert {"SEARCHSMITH_ARTIFACTS", "SEARCHSMITH_CHROMA_MODE", "SEARCHSMITH_CHROMA_HOST", "SEARCHSMITH_HOME"} <= set(env)
    assert env["SEARCHSMITH_CHROMA_HOST"].split(".")[0] in {name for kind, name in objects if kind == "Service"}
    assert search["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert 'Route("/healthz"' in (ROOT / "serving/api.py").read_text(), "the probe's path is a route of the service"
    _parses_as_searchsmith_command(search["command"])
    chroma = objects[("StatefulSet", "chroma")]["spec"]["template"]["spec"]["containers"][0]
    assert chroma["image"] == f"chromadb/chroma:{locked('chromadb')}", "server and client versions must match"
    assert objects[("PersistentVolumeClaim", "searchsmith-home")]["spec"]["accessModes"] == ["ReadWriteMany"]


def _parses_as_searchsmith_command(command: list[str]) -> None:
    from orchestration.cli import build_parser

    assert command[0] == "searchsmith"
    build_parser().parse_args(command[1:])  # exits (SystemExit) on an unknown flag


# --- Docker Compose -----------------------------------------------------------------------------


def test_compose_runs_every_part():
    services = set(compose()["services"])
    assert {"postgres", "seaweedfs", "chroma", "user-code", "webserver", "daemon", "api", "vllm"} <= services


def test_compose_searchsmith_services_set_every_variable_the_code_and_instance_read():
    spec = compose()
    required = set(ENV_VARS) | set(POSTGRES_ENV.values()) | {COMPUTE_LOGS_BUCKET_ENV, "AWS_ENDPOINT_URL_S3", "DAGSTER_HOME"}
    for name in SEARCHSMITH_SERVICES:
        service = spec["services"][name]
        assert service["image"].startswith("searchsmith:"), name
        assert required <= set(service["environment"]), (name, required - set(service["environment"]))


def test_compose_addresses_point_at_the_services_that_serve_them():
    spec = compose()
    env, services = spec["x-searchsmith-env"], spec["services"]
    postgres = services["postgres"]["environment"]
    assert (env["DAGSTER_PG_HOST"], env["DAGSTER_PG_USER"], env["DAGSTER_PG_DB"]) == ("postgres", postgres["POSTGRES_USER"], postgres["POSTGRES_DB"])
    assert env["DAGSTER_PG_PASSWORD"] == postgres["POSTGRES_PASSWORD"]
    endpoint = re.fullmatch(r"http://([\w-]+):(\d+)", env["AWS_ENDPOINT_URL_S3"])
    assert endpoint and endpoint.group(1) == "seaweedfs"
    assert f"-s3.port={endpoint.group(2)}" in services["seaweedfs"]["command"]
    assert services["seaweedfs"]["environment"]["AWS_ACCESS_KEY_ID"] == env["AWS_ACCESS_KEY_ID"]
    assert env["SEARCHSMITH_CHROMA_HOST"] in services and env["SEARCHSMITH_CHROMA_PORT"] == "8000"
    assert services["chroma"]["image"] == f"chromadb/chroma:{locked('chromadb')}", "server and client versions must match"
    bucket = env["SEARCHSMITH_ARTIFACTS"].removeprefix("s3://").split("/")[0]
    assert bucket == env[COMPUTE_LOGS_BUCKET_ENV] and f"'{bucket}'" in services["buckets"]["command"][-1]


def test_compose_webserver_and_daemon_reach_the_code_server_through_the_workspace():
    spec = compose()
    user_code = spec["services"]["user-code"]["command"]
    port = int(user_code[user_code.index("--port") + 1])
    assert user_code[:3] == ["dagster", "api", "grpc"] and user_code[user_code.index("--module-name") + 1] == CODE_MODULE
    (location,) = load("workspace.yaml")["load_from"]
    assert location["grpc_server"]["host"] == "user-code" and location["grpc_server"]["port"] == port
    copied = re.search(r"^COPY deploy/workspace\.yaml (\S+)$", dockerfile(), re.M).group(1)
    for name in ("webserver", "daemon"):
        command = spec["services"][name]["command"]
        assert command[command.index("--workspace") + 1] == copied, name
    _parses_as_searchsmith_command(spec["services"]["api"]["command"])


def test_compose_vllm_sees_the_adapters_where_the_pipeline_writes_them():
    spec = compose()
    home = spec["x-searchsmith-env"]["SEARCHSMITH_HOME"]
    vllm = spec["services"]["vllm"]
    assert any(volume.split(":")[1] == home for volume in vllm["volumes"])
    assert vllm["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--enable-lora" in vllm["command"]


# --- the image ----------------------------------------------------------------------------------


def test_dockerfile_copies_every_package_and_installs_from_the_lock():
    text = dockerfile()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        package = pattern.rstrip("*")
        assert (ROOT / package).is_dir() and re.search(rf"^COPY {package} \./{package}$", text, re.M), package
    installs = [line for line in text.splitlines() if "pip install" in line]
    assert installs and all("-c requirements.lock" in line for line in installs)
    assert "'.[k8s]'" in text, "the image needs dagster-postgres, dagster-aws and dagster-k8s"
    assert re.search(r"^COPY deploy/dagster\.yaml \$\{DAGSTER_HOME\}/dagster\.yaml$", text, re.M)
    command = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert command[command.index("--module-name") + 1] == CODE_MODULE
    shlex.split(" ".join(command))
