"""A trainer restarted while the environment runs on picks the run up again.

The environment waits for an action on the state it published last; a trainer that
starts after that state went out (a crash and a restart, a resume) would wait for an
observation forever. The topic contract has the environment re-publish its latest
observation whenever no action comes for `republish_period`; the new trainer acts on it.
"""

import pytest
from rclpy.parameter import Parameter
from ros_helpers import bridge_in_a_thread, spin_until

from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.checkpoint import Checkpoint, save_checkpoint
from unilab_ros.ros.params import ConfigError
from unilab_ros.trainer.metrics_log import read_metrics
from unilab_ros.trainer.node import TrainerNode
from unilab_ros.trainer.session import SessionConfig, build_session

pytestmark = pytest.mark.ros

NUM_ENVS, NUM_STEPS = 2, 5
WAIT_S = 20.0


def trainer_params(checkpoint_dir: str, **extra) -> list[Parameter]:
    params = {
        "num_envs": NUM_ENVS, "obs_dim": 3, "action_dim": 1, "num_steps": NUM_STEPS,
        "safe_action": [0.0], "tensorboard": False, "checkpoint_dir": checkpoint_dir,
        "step_timeout": 10.0, "obs_timeout": 10.0, "warm_up_update": False,
        "model.actor_hidden_dims": [8], "model.critic_hidden_dims": [8],
        "ppo.num_mini_batches": 1, "ppo.num_learning_epochs": 1, **extra,
    }
    return [Parameter(name, value=value) for name, value in params.items()]


def test_a_restarted_trainer_resumes_against_a_running_environment(context, tmp_path):
    with bridge_in_a_thread(context, num_envs=NUM_ENVS, republish_period=0.2) as (
            bridge, executor):
        first = TrainerNode(context=context, parameter_overrides=trainer_params(
            str(tmp_path / "a"), max_iterations=1))
        executor.add_node(first)
        assert spin_until(executor, lambda: first.finished, WAIT_S)
        steps_before = bridge.status.steps
        # The trainer goes away without a word; the environment waits on its latest state.
        executor.remove_node(first)
        first.destroy_node()
        spin_until(executor, lambda: False, 0.5)
        assert bridge.status.steps == steps_before

        second = TrainerNode(context=context, parameter_overrides=trainer_params(
            str(tmp_path / "b"), max_iterations=2,
            resume_from=str(tmp_path / "a" / "latest.safetensors")))
        executor.add_node(second)
        assert spin_until(executor, lambda: second.finished, WAIT_S), (
            f"the restarted trainer is {second.state.value}")
        assert bridge.status.observation_republishes >= 1
        assert bridge.status.steps >= steps_before + NUM_STEPS
        assert Checkpoint(tmp_path / "b" / "latest.safetensors").iteration == 2
        second.destroy_node()


def test_a_start_in_a_folder_killed_before_its_first_checkpoint_refuses_with_one_line(
    context, tmp_path
):
    """SIGKILL before checkpoint_interval, then the same command: the trainer started
    from iteration 0 with no warning, overwrote best.safetensors (-0.28 at iteration 3)
    with a worse one and metrics.csv read iterations 1, 2, 3, 1. Now it refuses, naming
    the folder and the parameters that choose, and the folder is untouched."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.csv").write_text("iteration,mean_return\r\n1,-0.9\r\n2,-0.5\r\n3,-0.28\r\n")
    agent = build_session(SessionConfig(AgentConfig(
        num_envs=NUM_ENVS, obs_dim=3, action_dim=1, num_steps=NUM_STEPS))).loop.agent
    agent.iteration = 3
    save_checkpoint(folder / "best.safetensors", agent, {"best_mean_return": -0.28})
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    with pytest.raises(ConfigError) as error:
        TrainerNode(context=context, parameter_overrides=trainer_params(str(folder)))
    [line] = str(error.value).splitlines()
    assert f"checkpoint_dir {folder} holds a run" in line
    assert f"resume_from:={folder / 'best.safetensors'}" in line
    assert "another checkpoint_dir" in line
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before


def test_a_restart_resumes_from_latest_and_keeps_the_better_best(context, tmp_path):
    """A run killed after its latest checkpoint (iteration 1) but after two more metrics
    rows, with a best policy better than any the restart can see: the restart resumes
    from latest (iteration 1 -> 2), metrics.csv reads 1, 2 and best.safetensors is the
    stored one (before, a new best of 3-step episodes replaced it)."""
    folder = tmp_path / "run"
    with bridge_in_a_thread(context, num_envs=NUM_ENVS, republish_period=0.2,
                            max_episode_steps=3) as (_bridge, executor):
        first = TrainerNode(context=context, parameter_overrides=trainer_params(
            str(folder), max_iterations=1))
        executor.add_node(first)
        assert spin_until(executor, lambda: first.finished, WAIT_S)
        executor.remove_node(first)
        first.destroy_node()
        assert Checkpoint(folder / "latest.safetensors").iteration == 1
        # What the killed run wrote after its last checkpoint: rows 2 and 3, and a best
        # no Pendulum policy reaches (its rewards are negative).
        with open(folder / "metrics.csv", "a", newline="") as handle:
            header = (folder / "metrics.csv").read_text().splitlines()[0].split(",")
            for iteration in (2, 3):
                handle.write(",".join(str(iteration) if name == "iteration" else "0"
                                      for name in header) + "\r\n")
        agent = build_session(SessionConfig(AgentConfig(
            num_envs=NUM_ENVS, obs_dim=3, action_dim=1, num_steps=NUM_STEPS))).loop.agent
        agent.iteration = 3
        save_checkpoint(folder / "best.safetensors", agent, {"best_mean_return": 0.0})
        best_before = (folder / "best.safetensors").read_bytes()

        second = TrainerNode(context=context, parameter_overrides=trainer_params(
            str(folder), max_iterations=2, best_min_episodes=1))
        assert second.agent.iteration == 1
        executor.add_node(second)
        assert spin_until(executor, lambda: second.finished, WAIT_S)
        second.destroy_node()
        assert second.stats.episodes > 0, "no episode ended: no best was offered"
        assert read_metrics(folder / "metrics.csv")["iteration"] == [1.0, 2.0]
        assert Checkpoint(folder / "latest.safetensors").iteration == 2
        assert (folder / "best.safetensors").read_bytes() == best_before
