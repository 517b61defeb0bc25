"""Models are named by id in everything PanelForge writes, never by a local directory's path."""

from __future__ import annotations

import pytest

from pipelines.core.provenance import public_model_name


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


def test_the_revision_of_a_local_model_is_what_identifies_its_weights(tmp_path):
    from pipelines.core.fingerprints import model_identity
    from pipelines.core.provenance import public_model

    snapshot = "/home/u/.cache/huggingface/hub/models--Qwen--Qwen2.5-VL-3B-Instruct/snapshots/66285546d2b8"
    assert public_model(snapshot, None) == ("Qwen/Qwen2.5-VL-3B-Instruct", "66285546d2b8")  # the snapshot's commit
    assert public_model("Qwen/Qwen2.5-VL-3B-Instruct", "main") == ("Qwen/Qwen2.5-VL-3B-Instruct", "main")
    assert public_model("Qwen/Qwen2.5-VL-3B-Instruct", None) == ("Qwen/Qwen2.5-VL-3B-Instruct", None)
    assert public_model("/gone/models/qwen", None) == ("local:qwen", None)  # no folder to hash: no revision
    one, two = tmp_path / "a" / "tiny", tmp_path / "b" / "tiny"
    for folder, size in ((one, 64), (two, 65)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
        (folder / "model.safetensors").write_bytes(b"\0" * size)
    name, revision = public_model(str(one), None)
    assert name == "local:tiny" and revision == model_identity(str(one)) and revision.startswith("local:")
    assert public_model(str(two), None)[1] != revision  # same folder name, other weights: told apart
    assert str(tmp_path) not in revision
