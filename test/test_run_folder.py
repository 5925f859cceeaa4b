"""Per-run output folders: namespaced, unique per run, with an atomically moved link."""

import os

import pytest

from unilab_ros.trainer.run_folder import (
    RestartPlan,
    RunFolderError,
    namespace_folder,
    new_run_folder,
    point_latest,
    restart_plan,
)


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


def _killed_run(folder, latest_iteration=None, best=True, rows=(1, 2, 3)):
    """A run folder as SIGKILL leaves it: metrics rows, maybe a best and a latest."""
    from unilab_ros.rl.agent import AgentConfig
    from unilab_ros.rl.checkpoint import save_checkpoint
    from unilab_ros.trainer.session import SessionConfig, build_session

    folder.mkdir()
    (folder / "metrics.csv").write_text(
        "iteration,mean_return\r\n" + "".join(f"{i},-1.0\r\n" for i in rows))
    agent = build_session(SessionConfig(AgentConfig(num_envs=2, obs_dim=3, action_dim=1,
                                                    num_steps=4))).loop.agent
    if best:
        agent.iteration = 3
        save_checkpoint(folder / "best.safetensors", agent, {"best_mean_return": -0.28})
    if latest_iteration is not None:
        agent.iteration = latest_iteration
        save_checkpoint(folder / "latest.safetensors", agent)


def test_a_new_or_empty_folder_starts_as_asked(tmp_path):
    assert restart_plan(tmp_path / "new") == RestartPlan("")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.csv").write_text("iteration,mean_return\r\n")
    assert restart_plan(tmp_path / "empty", resume_from="x.safetensors") == RestartPlan(
        "x.safetensors")


def test_a_folder_with_a_latest_checkpoint_is_resumed_from_it(tmp_path):
    folder = tmp_path / "run"
    _killed_run(folder, latest_iteration=2)
    plan = restart_plan(folder, max_iterations=10)
    assert plan.resume_from == str(folder / "latest.safetensors")
    assert "resuming it from" in plan.note and "(iteration 2)" in plan.note


def test_a_finished_run_is_not_trained_past_its_end(tmp_path):
    folder = tmp_path / "run"
    _killed_run(folder, latest_iteration=3)
    with pytest.raises(RunFolderError, match="finished at iteration 3 of max_iterations 3: "
                                             "raise max_iterations"):
        restart_plan(folder, max_iterations=3)


def test_a_folder_without_latest_is_refused_naming_what_to_give(tmp_path):
    folder = tmp_path / "run"
    _killed_run(folder)
    with pytest.raises(RunFolderError) as error:
        restart_plan(folder)
    message = str(error.value)
    assert message.startswith(f"checkpoint_dir {folder} holds a run (best.safetensors, "
                              "metrics.csv to iteration 3) but no latest.safetensors")
    assert f"resume_from:={folder / 'best.safetensors'}" in message
    bare = tmp_path / "metrics_only"
    _killed_run(bare, best=False)
    with pytest.raises(RunFolderError) as error:
        restart_plan(bare)
    assert "resume_from" not in str(error.value) and "another checkpoint_dir" in str(error.value)


def test_fine_tuning_into_a_folder_with_a_run_is_refused_and_resume_from_goes_on(tmp_path):
    folder = tmp_path / "run"
    _killed_run(folder, latest_iteration=2)
    with pytest.raises(RunFolderError, match="finetune.init_from starts a new run"):
        restart_plan(folder, init_from="policy.safetensors")
    chosen = str(folder / "best.safetensors")
    assert restart_plan(folder, resume_from=chosen).resume_from == chosen


def test_a_latest_that_cannot_be_read_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "latest.safetensors").write_bytes(b"cut short by a crash")
    with pytest.raises(RunFolderError) as error:
        restart_plan(folder)
    [line] = str(error.value).splitlines()
    assert line.startswith(f"checkpoint_dir {folder} holds a run (latest.safetensors), but it "
                           "cannot be resumed (cannot read")
    assert "resume_from:=" in line
