"""PolicyNode with real rclpy: a policy exported from a small PPOAgent, driven in-process."""

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from std_msgs.msg import Float32MultiArray, Float64MultiArray
from std_srvs.srv import SetBool

from unilab_ros.messages import read_matrix, to_float32_msg
from unilab_ros.params import ConfigError
from unilab_ros.policy_node import PolicyNode
from unilab_ros.rl import PPOAgent
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.checkpoint import export_policy, save_checkpoint
from unilab_ros.rl.model import ModelConfig

pytestmark = pytest.mark.ros

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, OBS_DIM, ACTION_DIM = 2, 3, 2
SCALE, LOW, HIGH, SAFE = [2.0, 0.5], [-1.0, -0.4], [1.0, 0.4], [0.1, -0.2]
WAIT_S = 5.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A policy whose mean actions are O(1), so scaling and clipping both show."""
    agent = PPOAgent(
        AgentConfig(num_envs=NUM_ENVS, obs_dim=OBS_DIM, action_dim=ACTION_DIM, seed=3),
        ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
    )
    last = agent.model.actor.layers[-1]
    # The output layer is initialised with gain 0.01: near-zero means would prove nothing.
    last.weight = last.weight * 300.0
    # Non-trivial normalizer statistics: the export must carry them.
    agent.model.normalizer.update(mx.array(np.random.default_rng(1).normal(2.0, 3.0, (64, 3))))
    mx.eval(agent.model.parameters())
    path = export_policy(tmp_path_factory.mktemp("policy") / "policy", agent)
    return path, agent.model


class Harness:
    def __init__(self, context: rclpy.Context, checkpoint: Path, **overrides) -> None:
        params = {
            "checkpoint": str(checkpoint),
            "num_envs": NUM_ENVS,
            "action_scale": SCALE,
            "action_low": LOW,
            "action_high": HIGH,
            "safe_action": SAFE,
            "obs_timeout": 10.0,
            **overrides,
        }
        self.node = PolicyNode(
            context=context,
            parameter_overrides=[Parameter(name, value=value) for name, value in params.items()],
        )
        self.peer = rclpy.create_node("policy_test_peer", context=context)
        self.obs_pub = self.peer.create_publisher(Float32MultiArray, "observation", 10)
        action_type = (
            Float64MultiArray if params.get("action_msg_type") == "float64" else Float32MultiArray
        )
        self.action_msgs: list = []
        self.action_sub = self.peer.create_subscription(
            action_type, "action", self.action_msgs.append, 100
        )
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.peer)
        assert self.spin_until(
            lambda: self.obs_pub.get_subscription_count() > 0
            and self.action_sub.get_publisher_count() > 0
        )

    def spin_until(self, predicate, timeout: float = WAIT_S) -> bool:
        return spin_until(self.executor, predicate, timeout)

    def act(self, obs: np.ndarray) -> np.ndarray:
        count = len(self.action_msgs)
        self.obs_pub.publish(to_float32_msg(obs, ("env", "obs")))
        assert self.spin_until(lambda: len(self.action_msgs) > count), "no action"
        return read_matrix(self.action_msgs[-1], NUM_ENVS, ACTION_DIM)

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.peer.destroy_node()


@pytest.fixture
def make_harness(context):
    made = []

    def make(checkpoint, **overrides) -> Harness:
        made.append(Harness(context, checkpoint, **overrides))
        return made[-1]

    yield make
    for harness in made:
        harness.close()


def expected_action(model, obs: np.ndarray) -> np.ndarray:
    mean = np.array(model.policy(mx.array(obs)))
    return np.clip(np.asarray(SCALE) * mean, LOW, HIGH)


def test_an_observation_gives_the_scaled_clipped_mean_action(make_harness, exported):
    path, model = exported
    harness = make_harness(path)
    rng = np.random.default_rng(0)
    for _ in range(3):
        obs = rng.normal(2.0, 3.0, (NUM_ENVS, OBS_DIM)).astype(np.float32)
        action = harness.act(obs)
        np.testing.assert_allclose(action, expected_action(model, obs), rtol=1e-5, atol=1e-6)
    # Both sides of the clip are exercised somewhere, else the check above is weak.
    raw = np.asarray(SCALE) * np.array(model.policy(mx.array(rng.normal(2.0, 3.0, (64, 3)))))
    assert (raw > HIGH).any() and (raw < LOW).any()
    assert harness.node.counters["actions"] == 3


def test_the_same_observation_gives_the_same_action(make_harness, exported):
    harness = make_harness(exported[0])
    obs = np.full((NUM_ENVS, OBS_DIM), 0.5, np.float32)
    np.testing.assert_array_equal(harness.act(obs), harness.act(obs))


def test_wrong_length_and_nan_observations_are_rejected(make_harness, exported):
    harness = make_harness(exported[0])
    harness.obs_pub.publish(Float32MultiArray(data=[0.0] * (NUM_ENVS * OBS_DIM + 1)))
    harness.obs_pub.publish(Float32MultiArray(data=[float("nan")] * (NUM_ENVS * OBS_DIM)))
    assert harness.spin_until(lambda: harness.node.counters["rejected_observations"] == 2)
    harness.spin_until(lambda: False, timeout=0.1)
    assert harness.action_msgs == []
    assert harness.act(np.zeros((NUM_ENVS, OBS_DIM), np.float32)).shape == (NUM_ENVS, ACTION_DIM)


def test_the_watchdog_publishes_the_safe_action(make_harness, exported):
    harness = make_harness(exported[0], obs_timeout=0.2, action_msg_type="float64")
    harness.act(np.zeros((NUM_ENVS, OBS_DIM), np.float32))
    assert harness.spin_until(lambda: harness.node.counters["watchdog_trips"] == 1)
    assert harness.spin_until(lambda: len(harness.action_msgs) >= 2)
    assert isinstance(harness.action_msgs[-1], Float64MultiArray)
    safe = read_matrix(harness.action_msgs[-1], NUM_ENVS, ACTION_DIM)
    np.testing.assert_allclose(safe, np.tile(SAFE, (NUM_ENVS, 1)), rtol=1e-6)


def test_a_missing_checkpoint_is_a_config_error(context, tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(ConfigError, match="no checkpoint at"):
        PolicyNode(
            context=context, parameter_overrides=[Parameter("checkpoint", value=str(missing))]
        )
    with pytest.raises(ConfigError, match="checkpoint must name"):
        PolicyNode(context=context)


def test_action_limits_of_the_wrong_size_are_a_config_error(context, exported):
    overrides = [
        Parameter("checkpoint", value=str(exported[0])),
        Parameter("action_scale", value=[1.0, 1.0, 1.0]),
    ]
    with pytest.raises(ConfigError, match="action_scale needs 1 or action_dim=2"):
        PolicyNode(context=context, parameter_overrides=overrides)


def test_main_exits_2_with_a_one_line_reason_without_a_checkpoint(ros_domain_env, tmp_path):
    env = dict(
        ros_domain_env,
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(PACKAGE_ROOT), ros_domain_env.get("PYTHONPATH")])
        ),
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "unilab_ros.policy_node",
            "--ros-args",
            "--params-file",
            str(PACKAGE_ROOT / "config" / "deploy.yaml"),
            "-p",
            f"checkpoint:={tmp_path / 'missing.safetensors'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    output = (result.stdout + result.stderr).strip().splitlines()
    assert "Traceback" not in result.stderr
    assert len(output) == 1 and "no checkpoint at" in output[0], output


def test_deterministic_is_live_and_the_service_keeps_the_parameter_in_agreement(
    make_harness, exported
):
    harness = make_harness(exported[0], deterministic=True)
    node = harness.node
    obs = np.random.default_rng(4).normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32)
    assert np.array_equal(harness.act(obs), harness.act(obs))
    client = harness.peer.create_client(SetBool, "/unilab_policy/set_deterministic")
    assert harness.spin_until(client.service_is_ready)
    future = client.call_async(SetBool.Request(data=False))
    assert harness.spin_until(future.done) and future.result().success
    assert node.get_parameter("deterministic").value is False and not node.cfg.deterministic
    assert not np.array_equal(harness.act(obs), harness.act(obs)), "sampling again"
    result = node.set_parameters([Parameter("deterministic", value=True)])[0]
    assert result.successful and node.cfg.deterministic
    refused = node.set_parameters([Parameter("num_envs", value=4)])[0]
    assert not refused.successful and "read-only" in refused.reason


def test_a_non_finite_action_becomes_the_safe_action(make_harness, exported):
    harness = make_harness(exported[0])
    layer = harness.node.model.actor.layers[0]
    layer.weight = layer.weight * float("nan")
    obs = np.zeros((NUM_ENVS, OBS_DIM), np.float32)
    np.testing.assert_allclose(harness.act(obs), np.broadcast_to(SAFE, (NUM_ENVS, ACTION_DIM)))
    assert harness.node.counters["nonfinite_actions"] == 1


def test_the_training_action_mapping_comes_from_the_checkpoint(context, tmp_path):
    agent = PPOAgent(AgentConfig(num_envs=NUM_ENVS, obs_dim=OBS_DIM, action_dim=ACTION_DIM),
                     ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]))
    trained = ActionConfig(action_scale=[2.0], action_low=[-2.0], action_high=[2.0],
                           safe_action=[0.5])
    path = save_checkpoint(tmp_path / "trained", agent, actions=trained)
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(path)), Parameter("num_envs", value=NUM_ENVS)])
    try:
        np.testing.assert_array_equal(node.actions.scale, [2.0, 2.0])
        np.testing.assert_array_equal(node.actions.high, [2.0, 2.0])
        np.testing.assert_array_equal(node.actions.safe, np.full((NUM_ENVS, ACTION_DIM), 0.5))
    finally:
        node.destroy_node()
    # A parameter given to the node overrides that one field (and is logged with both).
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(path)), Parameter("num_envs", value=NUM_ENVS),
        Parameter("action_scale", value=[0.5])])
    try:
        np.testing.assert_array_equal(node.actions.scale, [0.5, 0.5])
        np.testing.assert_array_equal(node.actions.high, [2.0, 2.0])
    finally:
        node.destroy_node()
