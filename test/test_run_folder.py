"""Per-run output folders: namespaced, unique per run, with an atomically moved link."""

import os

import pytest

from unilab_ros.run_folder import namespace_folder, new_run_folder, point_latest


@pytest.mark.parametrize(
    ("namespace", "folder"),
    [("/", "default"), ("", "default"), ("/robot1", "robot1"), ("/lab/arm_2", "lab_arm_2")],
)
def test_a_namespace_becomes_one_folder_name(namespace, folder):
    assert namespace_folder(namespace) == folder


def test_two_runs_get_two_folders_and_latest_follows_the_newest(tmp_path):
    first = new_run_folder(tmp_path, "/robot1", pid=100, now=0.0)
    second = new_run_folder(tmp_path, "/robot1", pid=101, now=0.0)
    other = new_run_folder(tmp_path, "/", pid=100, now=0.0)
    assert first != second and first.parent == second.parent == tmp_path / "robot1"
    assert other.parent == tmp_path / "default"
    assert first.name.endswith("-100") and second.name.endswith("-101")
    latest = tmp_path / "robot1" / "latest"
    # Relative, so the tree can be moved or copied whole.
    assert os.readlink(latest) == second.name
    assert latest.resolve() == second.resolve()
    assert sorted(p.name for p in (tmp_path / "robot1").iterdir()) == sorted(
        [first.name, second.name, "latest"]
    )


def test_a_clash_is_an_error_not_a_shared_folder(tmp_path):
    new_run_folder(tmp_path, "/", pid=7, now=0.0)
    with pytest.raises(FileExistsError):
        new_run_folder(tmp_path, "/", pid=7, now=0.0)


def test_latest_moves_only_when_the_run_points_it(tmp_path):
    kept = new_run_folder(tmp_path, "/", pid=1, now=0.0)
    aborted = new_run_folder(tmp_path, "/", pid=2, now=0.0, link_latest=False)
    latest = tmp_path / "default" / "latest"
    assert os.readlink(latest) == kept.name  # the aborted start hides nothing
    point_latest(aborted)
    assert os.readlink(latest) == aborted.name
