"""``core.atomic_dir.build_dir_once``: a folder appears whole or not at all, is built once, and a
race between two builders leaves one folder and no temporaries."""

import threading
from pathlib import Path

import pytest

from pipelines.core.atomic_dir import build_dir_once


def _whole(folder: Path) -> bool:
    return (folder / "done").is_file()


def test_two_builders_racing_leave_one_whole_folder_and_no_temporaries(tmp_path):
    both_building = threading.Barrier(2)
    calls: list[str] = []

    def build(staging: Path) -> None:
        calls.append(staging.name)
        both_building.wait(timeout=30)  # neither renames before the other has built: a real race
        (staging / "weights").write_text(staging.name)
        (staging / "done").write_text("")

    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(build_dir_once(tmp_path / "m", build, _whole)))
               for _ in range(2)]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == [tmp_path / "m", tmp_path / "m"] and len(calls) == 2
    assert all(name.startswith(".m-") for name in calls)  # hidden siblings of the folder
    assert (tmp_path / "m" / "weights").read_text() in calls  # one builder's copy, whole
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # the loser's staging folder is gone


def test_a_whole_folder_is_not_rebuilt(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "done").write_text("")
    assert build_dir_once(tmp_path / "m", lambda staging: pytest.fail("rebuilt"), _whole) == tmp_path / "m"


def test_a_failed_build_leaves_nothing(tmp_path):
    def build(staging: Path) -> None:
        (staging / "weights").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_dir_once(tmp_path / "cache" / "m", build, _whole)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_half_folder_in_the_way_is_an_error_not_a_result(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "weights").write_text("someone else's, without its marker")
    with pytest.raises(OSError):
        build_dir_once(tmp_path / "m", lambda staging: (staging / "done").write_text(""), _whole)
    assert [p.name for p in tmp_path.iterdir()] == ["m"] and not _whole(tmp_path / "m")
