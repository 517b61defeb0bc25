"""The deployment files under ``deploy/``: what can be checked without Docker or a cluster.

Every YAML parses; the Helm values use only keys Dagster's chart accepts; the RayCluster has
what KubeRay needs; the images pin what pyproject.toml pins; and the code location loads with the
environment the Helm values give it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from pipelines.vlm.ray_llm import VLLM_VERSION

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
HELM_VALUES = DEPLOY / "helm" / "values.yaml"
RAYCLUSTER = DEPLOY / "kuberay" / "raycluster.yaml"
DOCKERFILES = [DEPLOY / "docker" / "Dockerfile", DEPLOY / "docker" / "Dockerfile.gpu"]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def pins() -> dict[str, str]:
    """``name -> version`` of every ``name==version`` in pyproject.toml (extras stripped)."""
    specs = list(PYPROJECT["project"]["dependencies"])
    for extra in PYPROJECT["project"]["optional-dependencies"].values():
        specs += extra
    found = {}
    for spec in specs:
        name, _, version = spec.partition("==")
        found[re.sub(r"\[.*\]", "", name).strip()] = version.strip()
    return found


def test_every_yaml_under_deploy_parses():
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert {f.relative_to(DEPLOY).as_posix() for f in files} >= {
        "dagster.yaml",
        "dagster-cluster.yaml",
        "helm/values.yaml",
        "kuberay/raycluster.yaml",
    }
    for path in files:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        assert docs and all(isinstance(doc, dict) for doc in docs), path


# --- Helm values against Dagster's chart -------------------------------------------------------
# The chart's values schema is generated from pydantic models in dagster-io/dagster,
# helm/dagster/schema/schema/charts/ (dagster/values.py, dagster/subschema/{daemon,run_launcher,
# postgresql,concurrency,global_}.py, dagster_user_deployments/subschema/user_deployments.py);
# the generated values.schema.json was not retrievable for this chart version, so this is the
# part of it for the sections PanelForge sets, written from those models (Apache-2.0). Sections
# the models declare extra="forbid" have additionalProperties false, as the generated schema has:
# helm refuses a misspelled key there. Kubernetes-typed fields (resources, env) stay open.
_STR, _INT, _BOOL, _OBJ = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "object"}
_LIST = {"type": "array"}
_SECRET_REFS = {"type": "array", "items": {"type": "object", "required": ["name"]}}
_IMAGE = {
    "type": "object",
    "properties": {"repository": _STR, "tag": {"type": ["string", "null"]}, "pullPolicy": _STR},
    "required": ["repository"],
}
_TAG_LIMITS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"key": _STR, "value": {}, "limit": _INT},
        "required": ["key", "limit"],
        "additionalProperties": False,
    },
}
CHART_SCHEMA = {
    "type": "object",
    "properties": {
        "global": {
            "type": "object",
            "properties": {
                "postgresqlSecretName": _STR,
                "dagsterHome": _STR,
                "serviceAccountName": _STR,
                "celeryConfigSecretName": _STR,
            },
            "additionalProperties": False,
        },
        "dagster-user-deployments": {
            "type": "object",
            "properties": {
                "enabled": _BOOL,
                "enableSubchart": _BOOL,
                "imagePullSecrets": _LIST,
                "deployments": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": _STR,
                            "image": _IMAGE,
                            "port": _INT,
                            "dagsterApiGrpcArgs": {"type": "array", "items": _STR},
                            "codeServerArgs": {"type": "array", "items": _STR},
                            "includeConfigInLaunchedRuns": {"type": "object", "properties": {"enabled": _BOOL}},
                            "env": {"type": ["object", "array"]},
                            "envConfigMaps": _LIST,
                            "envSecrets": _SECRET_REFS,
                            **{k: _OBJ for k in ("annotations", "nodeSelector", "affinity", "podSecurityContext")},
                            **{k: _OBJ for k in ("securityContext", "resources", "labels")},
                            **{k: _OBJ for k in ("livenessProbe", "readinessProbe", "startupProbe")},
                            "tolerations": _LIST,
                            "volumeMounts": _LIST,
                            "volumes": _LIST,
                            "schedulerName": _STR,
                        },
                        "required": ["name", "image", "port"],
                        "additionalProperties": False,
                    },
                },
            },
            "additionalProperties": False,
        },
        "runLauncher": {
            "type": "object",
            "properties": {
                "type": {"enum": ["CeleryK8sRunLauncher", "K8sRunLauncher", "CustomRunLauncher"]},
                "config": {
                    "type": "object",
                    "properties": {
                        "k8sRunLauncher": {
                            "type": "object",
                            "properties": {
                                "image": _IMAGE,
                                "imagePullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
                                "jobNamespace": {"type": ["string", "null"]},
                                "loadInclusterConfig": _BOOL,
                                "kubeconfigFile": {"type": ["string", "null"]},
                                "envConfigMaps": _LIST,
                                "envSecrets": _SECRET_REFS,
                                "envVars": {"type": "array", "items": _STR},
                                "volumeMounts": _LIST,
                                "volumes": _LIST,
                                "labels": _OBJ,
                                "failPodOnRunFailure": _BOOL,
                                "resources": _OBJ,
                                "schedulerName": _STR,
                                "securityContext": _OBJ,
                                "runK8sConfig": _OBJ,
                            },
                            "additionalProperties": False,
                        }
                    },
                },
            },
            "required": ["type", "config"],
            "additionalProperties": False,
        },
        "postgresql": {
            "type": "object",
            "properties": {
                "image": _IMAGE,
                "enabled": _BOOL,
                "postgresqlHost": _STR,
                "postgresqlUsername": _STR,
                "postgresqlPassword": _STR,
                "postgresqlDatabase": _STR,
                "postgresqlParams": _OBJ,
                "postgresqlScheme": _STR,
                "service": {"type": "object", "properties": {"port": _INT}},
                "pool": _OBJ,
            },
        },
        "generatePostgresqlPasswordSecret": _BOOL,
        "dagsterDaemon": {
            "type": "object",
            "properties": {
                "enabled": _BOOL,
                "runCoordinator": {
                    "type": "object",
                    "properties": {
                        "enabled": _BOOL,
                        "type": {"enum": ["QueuedRunCoordinator", "CustomRunCoordinator"]},
                        "config": {
                            "type": "object",
                            "properties": {
                                "queuedRunCoordinator": {
                                    "type": "object",
                                    "properties": {
                                        "maxConcurrentRuns": _INT,
                                        "tagConcurrencyLimits": _TAG_LIMITS,
                                        "dequeueIntervalSeconds": _INT,
                                        "dequeueNumWorkers": _INT,
                                        "dequeueUseThreads": _BOOL,
                                        "blockOpConcurrencyLimitedRuns": _OBJ,
                                    },
                                    "additionalProperties": False,
                                }
                            },
                        },
                    },
                    "additionalProperties": False,
                },
                "runRetries": {
                    "type": "object",
                    "properties": {"enabled": _BOOL, "maxRetries": _INT, "retryOnAssetOrOpFailure": _BOOL},
                    "required": ["enabled"],
                },
                # rendered into the instance's run_monitoring by the chart's configmap-instance.yaml
                "runMonitoring": {
                    "type": "object",
                    "properties": {
                        "enabled": _BOOL,
                        "startTimeoutSeconds": _INT,
                        "cancelTimeoutSeconds": _INT,
                        "maxRuntimeSeconds": _INT,
                        "pollIntervalSeconds": _INT,
                        "maxResumeRunAttempts": _INT,
                        "freeSlotsAfterRunEndSeconds": _INT,
                    },
                    "required": ["enabled"],
                },
            },
        },
        "concurrency": {
            "type": "object",
            "properties": {
                "enabled": _BOOL,
                "pools": {
                    "type": "object",
                    "properties": {
                        "defaultLimit": _INT,
                        "granularity": {"enum": ["run", "op"]},
                        "opGranularityRunBuffer": _INT,
                    },
                    "additionalProperties": False,
                },
                "runs": {
                    "type": "object",
                    "properties": {"maxConcurrentRuns": _INT, "tagConcurrencyLimits": _TAG_LIMITS},
                    "additionalProperties": False,
                },
            },
            "additionalProperties": False,
        },
        "telemetry": {"type": "object", "properties": {"enabled": _BOOL}},
    },
    # the chart's top-level keys PanelForge may set (DagsterHelmValues); anything else is a typo
    "additionalProperties": False,
}


def test_helm_values_use_only_keys_of_dagsters_chart():
    jsonschema.validate(load(HELM_VALUES), CHART_SCHEMA)


def test_the_chart_schema_subset_catches_a_misspelled_key():
    values = load(HELM_VALUES)
    values["runLauncher"]["config"]["k8sRunLauncher"]["envSecret"] = [{"name": "panelforge-secrets"}]
    with pytest.raises(jsonschema.ValidationError, match="envSecret"):
        jsonschema.validate(values, CHART_SCHEMA)


def test_helm_values_deploy_this_repository_as_users_do():
    values = load(HELM_VALUES)
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    workspace = load(REPO / "workspace.yaml")["load_from"][0]["python_module"]
    assert deployment["dagsterApiGrpcArgs"][:2] == ["-m", workspace["module_name"]]
    env = {item["name"]: item["value"] for item in deployment["env"]}
    assert env["PANELFORGE_PROFILE"] == "cluster"
    # secrets come only from Kubernetes secrets: no value in this file looks like one
    secret_names = {
        "DAGSTER_PG_PASSWORD",
        "NCBI_API_KEY",
        "HF_TOKEN",
        "PANELFORGE_VLM_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
    }
    assert not secret_names & set(env)
    assert "postgresqlPassword" not in values["postgresql"]
    assert values["generatePostgresqlPasswordSecret"] is False and values["global"]["postgresqlSecretName"]
    # the runs get the same secrets as the code location
    assert values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"] == deployment["envSecrets"]


def test_helm_concurrency_is_the_cluster_instance_files():
    values = load(HELM_VALUES)
    cluster = load(DEPLOY / "dagster-cluster.yaml")["concurrency"]
    chart = values["concurrency"]
    assert chart["enabled"] is True
    assert chart["pools"] == {"granularity": cluster["pools"]["granularity"]}
    assert chart["runs"]["maxConcurrentRuns"] == cluster["runs"]["max_concurrent_runs"]
    assert chart["runs"]["tagConcurrencyLimits"] == cluster["runs"]["tag_concurrency_limits"]
    # the chart fails to render when a limit is set both here and on the run coordinator
    queued = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    assert "maxConcurrentRuns" not in queued and "tagConcurrencyLimits" not in queued
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    # and the storage scheme matches the instance file's
    assert (
        values["postgresql"]["postgresqlScheme"]
        == load(DEPLOY / "dagster-cluster.yaml")["storage"]["postgres"]["postgres_db"]["scheme"]
    )


def test_every_shipped_instance_frees_the_slots_of_dead_runs():
    """Run monitoring on (the daemon's concurrency-slot sweep runs only then) with a delay after
    which a finished run's slots are freed: without both, a run killed with -9 keeps the `gpu`
    pool's slot for ever (test_run_monitoring.py shows the slot coming back)."""
    for name in ("dagster.yaml", "dagster-cluster.yaml"):
        monitoring = load(DEPLOY / name)["run_monitoring"]
        assert monitoring["enabled"] is True, name
        assert monitoring["free_slots_after_run_end_seconds"] > 0, name
        assert monitoring["max_resume_run_attempts"] == 0, name  # the default launcher cannot resume runs
    chart = load(HELM_VALUES)["dagsterDaemon"]["runMonitoring"]
    cluster = load(DEPLOY / "dagster-cluster.yaml")["run_monitoring"]
    assert chart["enabled"] is True
    assert chart["freeSlotsAfterRunEndSeconds"] == cluster["free_slots_after_run_end_seconds"]
    assert chart["pollIntervalSeconds"] == cluster["poll_interval_seconds"]
    assert chart["maxResumeRunAttempts"] == 0  # a pod that died is retried as a new run (runRetries)


# --- KubeRay ----------------------------------------------------------------------------------


def _containers(group: dict) -> list[dict]:
    containers = group["template"]["spec"]["containers"]
    assert containers and all(c.get("name") and c.get("image") for c in containers)
    return containers


def test_raycluster_has_what_kuberay_requires():
    manifest = load(RAYCLUSTER)
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayCluster"
    assert manifest["metadata"]["name"]
    spec = manifest["spec"]
    assert spec["rayVersion"] == pins()["ray"]
    assert isinstance(spec["headGroupSpec"]["rayStartParams"], dict)
    head = _containers(spec["headGroupSpec"])[0]
    assert {p["containerPort"] for p in head["ports"]} >= {6379, 8265, 10001}  # GCS, dashboard, client
    assert spec["workerGroupSpecs"]
    for group in spec["workerGroupSpecs"]:
        assert group["groupName"] and isinstance(group["rayStartParams"], dict)
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        _containers(group)
    # rayStartParams values are strings in the CRD (map[string]string)
    for params in [spec["headGroupSpec"]["rayStartParams"]] + [g["rayStartParams"] for g in spec["workerGroupSpecs"]]:
        assert all(isinstance(v, str) for v in params.values())


def test_raycluster_gpu_workers_run_the_gpu_image_and_the_head_the_cpu_image():
    spec = load(RAYCLUSTER)["spec"]
    (gpu,) = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu"]
    (worker,) = _containers(gpu)
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == worker["resources"]["limits"]["nvidia.com/gpu"]
    assert worker["image"].split(":")[0].endswith("panelforge-gpu")
    # the head is the Dagster code image: same Python and Ray as the runs that connect to it
    (deployment,) = load(HELM_VALUES)["dagster-user-deployments"]["deployments"]
    head = _containers(spec["headGroupSpec"])[0]
    assert head["image"] == f"{deployment['image']['repository']}:{deployment['image']['tag']}"
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    # the Helm values point the runs at the head service KubeRay creates (<name>-head-svc)
    env = {item["name"]: item["value"] for item in deployment["env"]}
    assert env["PANELFORGE_RAY_ADDRESS"] == f"ray://{load(RAYCLUSTER)['metadata']['name']}-head-svc:10001"


def test_the_vllm_version_named_for_the_workers_is_the_mining_stages():
    assert f"vllm=={VLLM_VERSION}" in RAYCLUSTER.read_text()
    assert f"VLLM_VERSION={VLLM_VERSION}" in DOCKERFILES[1].read_text()


# --- images -----------------------------------------------------------------------------------


def build_args(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S*)", dockerfile.read_text(), flags=re.MULTILINE))


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_pin_what_pyproject_pins(dockerfile):
    args, pinned = build_args(dockerfile), pins()
    assert args["TORCH_VERSION"] == pinned["torch"]
    assert args["TORCHVISION_VERSION"] == pinned["torchvision"]
    text = dockerfile.read_text()
    assert "pip install -e " in text and "[k8s]" in text  # the code and dagster-k8s, editable
    assert "DAGSTER_HOME=" in text and "PANELFORGE_PROFILE=cluster" in text


def test_gpu_image_pins_faiss_ray_and_python_as_the_cpu_image():
    gpu, pinned = build_args(DOCKERFILES[1]), pins()
    name, _, version = gpu["FAISS_GPU"].partition("==")
    assert pinned[name] == version
    assert gpu["RAY_VERSION"] == pinned["ray"]
    # one Python minor version across the Ray cluster: the CPU image's base and the GPU venv
    cpu_python = re.search(r"^FROM python:(\d+\.\d+)", DOCKERFILES[0].read_text(), flags=re.MULTILINE).group(1)
    assert f"uv venv --python {cpu_python} /opt/venv" in DOCKERFILES[1].read_text()
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:\S+-runtime-", DOCKERFILES[1].read_text(), flags=re.MULTILINE)
    low, high = re.match(r">=(\d+\.\d+),<(\d+\.\d+)", PYPROJECT["project"]["requires-python"]).groups()
    assert tuple(map(int, low.split("."))) <= tuple(map(int, cpu_python.split("."))) < tuple(map(int, high.split(".")))


def test_dockerignore_keeps_out_local_state_but_not_the_code():
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    ignored.discard("")
    assert {".git", ".venv", "data", ".demo"} <= ignored
    needed = {"pyproject.toml", "README.md", "workspace.yaml", "deploy", "sample", "pipelines", "assets"}
    needed |= {"resources", "jobs"}
    assert not needed & ignored


# --- the code location with the cluster environment -------------------------------------------


def _validate(env: dict) -> subprocess.CompletedProcess:
    dagster = str(Path(sys.executable).with_name("dagster"))
    return subprocess.run(
        [dagster, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_code_location_loads_with_the_helm_environment(tmp_path):
    (deployment,) = load(HELM_VALUES)["dagster-user-deployments"]["deployments"]
    helm_env = {item["name"]: item["value"] for item in deployment["env"]}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PANELFORGE_", "DAGSTER_PG_"))}
    env = {**base, **helm_env, "DAGSTER_HOME": str(tmp_path)}
    done = _validate(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All code locations passed validation" in done.stdout + done.stderr

    # and the check is real: a bad setting in that environment fails the load, naming it
    done = _validate({**env, "PANELFORGE_SHARDS": "0"})
    assert done.returncode != 0
    assert "PANELFORGE_SHARDS must be at least 1" in done.stdout + done.stderr
