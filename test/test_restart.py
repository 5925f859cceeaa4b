"""A trainer restarted while the environment runs on picks the run up again.

The environment waits for an action on the state it published last; a trainer that
starts after that state went out (a crash and a restart, a resume) would wait for an
observation forever. The topic contract has the environment re-publish its latest
observation whenever no action comes for `republish_period`; the new trainer acts on it.
"""

import threading

import pytest
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_helpers import spin_until

from unilab_ros.gym_env_node import GymEnvNode
from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.trainer.node import TrainerNode

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
    bridge = GymEnvNode(context=context, parameter_overrides=[
        Parameter("num_envs", value=NUM_ENVS), Parameter("republish_period", value=0.2)])
    bridge_executor = SingleThreadedExecutor(context=context)
    bridge_executor.add_node(bridge)
    thread = threading.Thread(target=bridge_executor.spin, daemon=True)
    thread.start()
    executor = SingleThreadedExecutor(context=context)
    try:
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
    finally:
        executor.shutdown()
        bridge_executor.shutdown()
        thread.join(timeout=5.0)
        bridge.destroy_node()
