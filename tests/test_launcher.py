"""Launching GPU work: a real subprocess and a real local Ray run the selftest job through Pipes."""

import json
import sys
from pathlib import Path

import pytest
from dagster import AssetExecutionContext, DagsterInstance, MaterializeResult, asset, materialize

from pipelines.launch import LaunchInfo, checkpoint_step, latest_checkpoint, prune_checkpoints, save_checkpoint
from pipelines.launch_selftest import SelftestConfig
from resources.launcher import JobLauncherResource, LauncherUnavailableError, build_command
from resources.profiles import build_resources
from resources.settings import Settings, SettingsError
from testing.loopback.ray_jobs import RayJobsLoopbackServer

MODULE = "pipelines.launch_selftest"
REPO = Path(__file__).resolve().parents[1]


def _asset(workdir: str, config: dict):
    @asset(name="selftest_training")
    def selftest_training(context: AssetExecutionContext, launcher: JobLauncherResource) -> MaterializeResult:
        result = launcher.run(context, MODULE, config, workdir)
        steps = [m["step"] for m in result.get_custom_messages()]
        context.log.info(f"steps reported: {steps}")
        return result.get_materialize_result()

    return selftest_training


def _launcher(backend: str, **kwargs) -> JobLauncherResource:
    # the job imports `pipelines` from the checkout, as an installed panelforge would provide it
    return JobLauncherResource(backend=backend, cwd=str(REPO), env={"PYTHONPATH": str(REPO)}, **kwargs)


def _materialize(workdir: str, config: dict, launcher: JobLauncherResource, instance: DagsterInstance):
    return materialize(
        [_asset(workdir, config)], resources={"launcher": launcher}, instance=instance, raise_on_error=False
    )


def _messages(instance: DagsterInstance, result) -> list[str]:
    """Every line of the run's event log: Dagster's events and the job's Pipes log lines."""
    return [r.user_message for r in instance.all_logs(result.run_id) if r.user_message]


def _materialization(result) -> dict:
    [mat] = result.asset_materializations_for_node("selftest_training")
    return {k: v.value for k, v in mat.metadata.items()}


def _run_dir(workdir: Path) -> Path:
    [folder] = [p for p in workdir.iterdir() if p.is_dir()]
    return folder


def _check_resume(workdir: Path, launcher: JobLauncherResource, instance: DagsterInstance) -> None:
    """Fail at step 3 once, then resume there; checkpoints, report and logs land where promised."""
    config = {"steps": 5, "fail_at_step": 3}
    first = _materialize(str(workdir), config, launcher, instance)
    assert not first.success
    run_dir = _run_dir(workdir)
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == [f"ckpt-{i:08d}.json" for i in range(3)]
    logs = "\n".join(_messages(instance, first))
    assert "starts at step 0 of 5" in logs and "injected failure at step 3" in logs
    assert "step 2: loss=0.333333" in logs  # report_progress lines stream into the run log

    second = _materialize(str(workdir), config, launcher, instance)
    assert second.success, _messages(instance, second)
    assert _run_dir(workdir) == run_dir  # the same training, though a new Dagster run
    logs = "\n".join(_messages(instance, second))
    assert "starts at step 3 of 5" in logs and "starts at step 0" not in logs
    assert "steps reported: [3, 4]" in logs
    meta = _materialization(second)
    assert meta["start_step"] == 3 and meta["steps"] == 5 and meta["total"] == 0 + 1 + 2 + 3 + 4
    assert meta["launch_run_dir"] == str(run_dir) and meta["launch_run_id"] == run_dir.name
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [f"ckpt-{i:08d}.json" for i in range(5)]
    assert json.loads((run_dir / "report.json").read_text())["start_step"] == 3
    written = json.loads((run_dir / "config.json").read_text())
    assert written["launch"]["dagster_run_id"] == second.run_id and written["steps"] == 5


def test_subprocess_streams_reports_and_resumes(tmp_path):
    with DagsterInstance.ephemeral() as instance:
        _check_resume(tmp_path / "runs", _launcher("subprocess"), instance)


def test_subprocess_clean_run_reports_every_step(tmp_path):
    with DagsterInstance.ephemeral() as instance:
        result = _materialize(str(tmp_path / "runs"), {"steps": 3}, _launcher("subprocess"), instance)
        assert result.success
        assert "steps reported: [0, 1, 2]" in "\n".join(_messages(instance, result))
    meta = _materialization(result)
    assert meta["start_step"] == 0 and meta["total"] == 3 and meta["launch_backend"] == "subprocess"


def test_a_slow_step_still_writes_heartbeat_lines(tmp_path):
    # one step of 1.5 s with a 0.2 s heartbeat: the run log hears from the job while it computes
    config = {"steps": 1, "sleep_s": 1.5, "heartbeat_s": 0.2}
    with DagsterInstance.ephemeral() as instance:
        result = _materialize(str(tmp_path / "runs"), config, _launcher("subprocess"), instance)
        assert result.success
        logs = _messages(instance, result)
    beats = [line for line in logs if line.startswith("job progress: 0 steps reported")]
    assert len(beats) >= 2, logs  # 1.5 s / 0.2 s: several before step 0 is reported
    assert any(line.startswith("job done: 1 steps reported") for line in logs), logs


def test_changed_config_is_a_new_training(tmp_path):
    with DagsterInstance.ephemeral() as instance:
        for steps in (2, 3):
            assert _materialize(str(tmp_path / "runs"), {"steps": steps}, _launcher("subprocess"), instance).success
    assert len([p for p in (tmp_path / "runs").iterdir()]) == 2


@pytest.fixture(scope="module")
def local_ray():
    """A real Ray on this machine (no dashboard: ray[default] is not installed here)."""
    ray = pytest.importorskip("ray")
    import os

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved]))
    if ray.is_initialized():  # an earlier test's Ray in this process: its workers lack that PYTHONPATH
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
    if saved is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = saved


def test_ray_task_streams_reports_and_resumes(tmp_path, local_ray):
    """The Ray backend without a dashboard address: the entrypoint runs in a Ray task; messages
    come back as fsspec chunks in the run dir."""
    with DagsterInstance.ephemeral() as instance:
        # a Ray on this machine: its workers have this interpreter (a cluster's have `python`)
        _check_resume(tmp_path / "runs", _launcher("ray", python=sys.executable), instance)
    pipes_dirs = list(_run_dir(tmp_path / "runs").glob("pipes/*/1.json"))
    assert len(pipes_dirs) == 2  # one message stream per launch, in the lake


def test_ray_job_submission_streams_reports_and_resumes(tmp_path):
    """The Ray backend with a dashboard address submits a Ray job over the job submission REST
    API, here to a loopback stand-in (the real dashboard needs ray[default], not installed here)
    that runs the entrypoint as a Ray head would, with the runtime_env's env_vars; messages come
    back as fsspec chunks."""
    with RayJobsLoopbackServer(cwd=str(REPO)) as jobs, DagsterInstance.ephemeral() as instance:
        launcher = _launcher(
            "ray",
            python=sys.executable,
            gpus=1,
            ray_address=jobs.address,
            ray_runtime_env={"env_vars": {"PANELFORGE_TEST": "1"}},
        )
        _check_resume(tmp_path / "runs", launcher, instance)
    first, second = jobs.submissions
    assert first["entrypoint"].startswith(f"{sys.executable} -m {MODULE} --config ")
    assert first["entrypoint_num_gpus"] == 1
    env_vars = second["runtime_env"]["env_vars"]
    assert env_vars["PANELFORGE_TEST"] == "1" and "DAGSTER_PIPES_CONTEXT" in env_vars
    assert second["metadata"]["dagster_run_id"]


def test_kubernetes_without_dagster_k8s_says_what_to_install(tmp_path):
    import importlib.util

    if importlib.util.find_spec("dagster_k8s") is not None:
        pytest.skip("dagster-k8s is installed here")
    with DagsterInstance.ephemeral() as instance:
        result = _materialize(str(tmp_path / "runs"), {"steps": 1}, _launcher("kubernetes"), instance)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    error = failure.step_failure_data.error.cause
    assert error.cls_name == LauncherUnavailableError.__name__
    assert "pip install 'panelforge[k8s]'" in error.message
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_gpus_above_one_wrap_the_module_in_torchrun():
    launcher = JobLauncherResource(backend="subprocess", gpus=2, python="/opt/py/bin/python")
    assert launcher.command(MODULE, "s3://lake/runs/x/config.json") == [
        "/opt/py/bin/python",
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        MODULE,
        "--config",
        "s3://lake/runs/x/config.json",
    ]
    assert build_command("python", MODULE, "c.json", gpus=1) == ["python", "-m", MODULE, "--config", "c.json"]
    assert JobLauncherResource(backend="ray").command(MODULE, "c.json")[0] == "python"
    assert JobLauncherResource(backend="subprocess").command(MODULE, "c.json")[0] == sys.executable


def test_latest_checkpoint_ignores_partial_files(tmp_path):
    folder = str(tmp_path / "ckpt")
    assert latest_checkpoint(folder) is None
    for step in (0, 1, 10, 2):
        save_checkpoint(folder, step, b"x")
    assert not list((tmp_path / "ckpt").glob(".*.tmp"))  # save_checkpoint leaves no temporaries
    (tmp_path / "ckpt" / ".ckpt-00000011.pt.abc.tmp").write_bytes(b"partial")  # a killed writer's
    last = latest_checkpoint(folder)
    assert last == f"{folder}/ckpt-00000010.pt" and checkpoint_step(last) == 10


def test_a_killed_jobs_partial_checkpoint_is_in_the_lakes_tmp_and_swept_by_the_next_save(tmp_path):
    """A job whose config names the lake's _tmp/ (the launcher's ``launch.tmp_dir``) stages every
    file there: killed while saving, it leaves nothing among its checkpoints, and its next save
    removes what it left."""
    import os
    import subprocess
    import textwrap

    folder, tmp_dir = tmp_path / "lake" / "models" / "runs" / "r1" / "checkpoints", tmp_path / "lake" / "_tmp" / "jobs"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"launch": {"tmp_dir": str(tmp_dir / "r1")}}))
    script = textwrap.dedent(
        f"""
        import os
        from pipelines import launch
        launch.load_config({str(config)!r})
        launch.save_checkpoint({str(folder)!r}, 1, b"whole")
        os.replace = lambda src, dst: os._exit(9)  # killed after writing, before the rename
        launch.save_checkpoint({str(folder)!r}, 2, b"partial")
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    assert subprocess.run([sys.executable, "-c", script], env=env, timeout=120).returncode == 9
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-00000001.pt"]
    left = sorted(p.name for p in (tmp_dir / "r1").iterdir())
    assert len(left) == 2 and left[0].startswith("ckpt-00000002.pt.") and left[1].endswith(".tmp.lock")
    assert latest_checkpoint(str(folder)) == f"{folder}/ckpt-00000001.pt"
    # the resumed job saves step 2 again: its partial file goes, the checkpoint appears
    save_checkpoint(str(folder), 2, b"whole", tmp_dir=str(tmp_dir / "r1"))
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-00000001.pt", "ckpt-00000002.pt"]
    assert list((tmp_dir / "r1").iterdir()) == []


def test_prune_keeps_the_newest_whole_checkpoints(tmp_path):
    folder = str(tmp_path / "ckpt")
    assert prune_checkpoints(folder, 2) == []  # no folder yet: nothing to do
    for step in (3, 1, 12, 7):
        save_checkpoint(folder, step, b"x")
    (tmp_path / "ckpt" / "notes.txt").write_text("not a checkpoint")
    assert prune_checkpoints(folder, 0) == []  # 0 keeps every one
    assert prune_checkpoints(folder, 2) == [f"{folder}/ckpt-00000001.pt", f"{folder}/ckpt-00000003.pt"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "ckpt-00000007.pt",
        "ckpt-00000012.pt",
        "notes.txt",
    ]
    # a fresh run at step 2 beside an earlier run's step 12: the earlier one is not its to remove
    save_checkpoint(folder, 2, b"x")
    assert prune_checkpoints(folder, 1, upto=2) == []
    assert prune_checkpoints(folder, 1, upto=7) == [f"{folder}/ckpt-00000002.pt"]


def test_job_configs_refuse_unknown_keys_by_name_and_take_the_launch_section():
    with pytest.raises(
        ValueError, match=r"unknown selftest config keys: \['stpes'\] \('stpes': did you mean 'steps'\?\)"
    ):
        SelftestConfig.from_dict({"stpes": 3})
    with pytest.raises(ValueError, match=r"\['colour', 'stpes'\]"):  # every unknown key, a hint where one is near
        SelftestConfig.from_dict({"stpes": 3, "colour": "red"})
    assert SelftestConfig.from_dict({"steps": 3, "sleep_s": 0.5}) == SelftestConfig(steps=3, sleep_s=0.5)
    # the launcher's section: known keys read, keys of a newer launcher ignored, absent ones defaulted
    info = LaunchInfo.from_dict({"run_id": "r1", "run_dir": "s3://lake/runs/r1", "gpus": 2, "tmp_dir": "/x"})
    assert (info.run_id, info.run_dir, info.gpus, info.checkpoint_dir) == ("r1", "s3://lake/runs/r1", 2, None)
    assert LaunchInfo.from_dict(None) == LaunchInfo() and LaunchInfo().run_id == "manual"


def test_an_unknown_key_fails_the_launched_run_with_its_name_in_dagster(tmp_path):
    with DagsterInstance.ephemeral() as instance:
        result = _materialize(str(tmp_path / "runs"), {"stpes": 3}, _launcher("subprocess"), instance)
        assert not result.success
        records = instance.all_logs(result.run_id)
    # Pipes hands the job's exception to Dagster as a structured error (shown in the run's UI)
    errors = [
        r.dagster_event.engine_event_data.error
        for r in records
        if r.dagster_event is not None and r.dagster_event.is_engine_event and r.dagster_event.engine_event_data.error
    ]
    assert [e.cls_name for e in errors] == ["ValueError"]
    assert errors[0].message.startswith("ValueError: unknown selftest config keys: ['stpes']")
    assert not (_run_dir(tmp_path / "runs") / "checkpoints").exists()  # refused before any step


def test_launcher_settings_and_profiles():
    assert Settings.from_env({}).launcher == "subprocess"
    assert Settings.from_env({"PANELFORGE_PROFILE": "cluster"}).launcher == "ray"
    settings = Settings.from_env({"PANELFORGE_LAUNCHER": "kubernetes", "PANELFORGE_JOB_GPUS": "4"})
    launcher = build_resources(settings)["launcher"]
    assert (launcher.backend, launcher.gpus) == ("kubernetes", 4)
    with pytest.raises(SettingsError, match="PANELFORGE_LAUNCHER"):
        Settings.from_env({"PANELFORGE_LAUNCHER": "slurm"})
    with pytest.raises(SettingsError, match="PANELFORGE_JOB_GPUS"):
        Settings.from_env({"PANELFORGE_JOB_GPUS": "-1"})
