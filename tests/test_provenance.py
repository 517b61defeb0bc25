"""Models are named by id in everything PanelForge writes, never by a local directory's path."""

from __future__ import annotations

import pytest

from pipelines.provenance import public_model_name


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ("Qwen/Qwen2.5-VL-7B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct"),
        ("gpt2", "gpt2"),
        ("/work/me/data/models/vlm/tiny-qwen2_5_vl-seed0", "local:tiny-qwen2_5_vl-seed0"),
        ("/scratch/u/models/Qwen2.5-VL-72B-Instruct/", "local:Qwen2.5-VL-72B-Instruct"),
        ("~/models/detector", "local:detector"),
        ("./weights/dinov2", "local:dinov2"),
        ("C:\\models\\qwen", "local:qwen"),
        (
            "/root/.cache/huggingface/hub/models--Qwen--Qwen2.5-VL-7B-Instruct/snapshots/cc594898137f",
            "Qwen/Qwen2.5-VL-7B-Instruct",
        ),
        ("synthetic-tiny-dab-detr", "synthetic-tiny-dab-detr"),
        (None, None),
        ("", ""),
    ],
)
def test_a_local_directory_is_named_by_its_folder_or_its_hub_id(given, named):
    assert public_model_name(given) == named


def test_a_relative_directory_that_exists_is_local(tmp_path, monkeypatch):
    (tmp_path / "models" / "qwen").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert public_model_name("models/qwen") == "local:qwen"  # looks like a hub id, but is a directory here


def test_engine_provenance_never_holds_the_model_directory(tmp_path):
    from pipelines.vlm.engine import EngineConfig, provenance
    from testing.vlm import ScriptedEngine

    directory = tmp_path / "data" / "models" / "vlm" / "tiny-qwen2_5_vl-seed0"
    directory.mkdir(parents=True)
    engine = ScriptedEngine(lambda request: "", EngineConfig(model=str(directory), synthetic=True))
    assert provenance(engine, "p1")["model"] == "local:tiny-qwen2_5_vl-seed0"
    assert engine.info()["model"] == str(directory)  # the engine itself still loads from where it is
