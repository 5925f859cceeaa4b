"""The trainer node runs the off-policy learner (algorithm: sac) against the Gymnasium
bridge, a trainer started again in its folder (after a kill) resumes with its replay, and
learning while acting never pauses the environment."""

import pytest
from rclpy.parameter import Parameter
from ros_helpers import bridge_in_a_thread, spin_until

from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_checkpoint import replay_path
from unilab_ros.trainer.node import TrainerNode

pytestmark = pytest.mark.ros

NUM_ENVS, NUM_STEPS = 2, 8
WAIT_S = 30.0


def sac_params(checkpoint_dir: str, **extra) -> list[Parameter]:
    params = {
        "algorithm": "sac", "num_envs": NUM_ENVS, "obs_dim": 3, "action_dim": 1,
        "num_steps": NUM_STEPS, "action_scale": [2.0], "action_low": [-2.0],
        "action_high": [2.0], "safe_action": [0.0], "tensorboard": False,
        "checkpoint_dir": checkpoint_dir, "checkpoint_interval": 2, "step_timeout": 10.0,
        "obs_timeout": 10.0, "sac.actor_hidden_dims": [16], "sac.critic_hidden_dims": [16],
        "sac.batch_size": 16, "sac.learning_starts": 20, **extra,
    }
    return [Parameter(name, value=value) for name, value in params.items()]


def test_the_trainer_learns_off_policy_and_a_restart_resumes_with_its_replay(context,
                                                                               tmp_path):
    folder = tmp_path / "run"
    with bridge_in_a_thread(context, num_envs=NUM_ENVS, republish_period=0.2) as (
            _bridge, executor):
        first = TrainerNode(context=context, parameter_overrides=sac_params(
            str(folder), max_iterations=4))
        assert isinstance(first.agent, SACAgent)
        # A dump shows what runs: the learner and its settings.
        assert first.get_parameter("algorithm").value == "sac"
        assert first.get_parameter("sac.batch_size").value == 16
        executor.add_node(first)
        assert spin_until(executor, lambda: first.finished, WAIT_S), first.state.value
        learned = first.agent.learner.steps
        stored = first.agent.replay.size
        assert stored == 4 * NUM_ENVS * NUM_STEPS and learned >= stored - 20 - NUM_ENVS
        # Killed: no goodbye, what the folder holds is what the last checkpoint wrote.
        executor.remove_node(first)
        first.destroy_node()
        latest = folder / "latest.safetensors"
        assert Checkpoint(latest).algorithm == "sac" and replay_path(latest).is_file()

        second = TrainerNode(context=context, parameter_overrides=sac_params(
            str(folder), max_iterations=6))
        assert second.agent.iteration == 4 and second.agent.replay.size == stored
        assert second.agent.learner.steps == learned
        executor.add_node(second)
        assert spin_until(executor, lambda: second.finished, WAIT_S), second.state.value
        assert second.agent.replay.size == stored + 2 * NUM_ENVS * NUM_STEPS
        assert Checkpoint(latest).iteration == 6
        second.destroy_node()


def test_learning_while_acting_never_pauses_the_environment(context, tmp_path):
    """learn_while_acting: the bridge is never paused (its pause service is configured)
    and every iteration reports the learner thread's gradient steps and policy lag."""
    with bridge_in_a_thread(context, num_envs=NUM_ENVS, republish_period=0.2) as (
            bridge, executor):
        trainer = TrainerNode(context=context, parameter_overrides=sac_params(
            str(tmp_path / "run"), max_iterations=6, learn_while_acting=True,
            pause_service="/gym_env/pause", resume_service="/gym_env/resume"))
        executor.add_node(trainer)
        assert spin_until(executor, lambda: trainer.finished, WAIT_S), trainer.state.value
        assert bridge._paused_since == 0.0  # never paused
        assert trainer.loop.learner is not None and trainer.loop.updates_run == 6
        metrics = trainer.last_metrics
        assert {"policy_lag", "utd_achieved", "updates_owed"} <= metrics.keys()
        trainer.destroy_node()
        assert not trainer.loop.learner.running
