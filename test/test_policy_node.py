"""PolicyNode's actions with real rclpy (``policy_harness``): the policy's scaled, clipped
mean; rejected observations; the mapping from the checkpoint or bundle; the watchdog,
e-stop, blend-in, rate limit and non-finite guards."""

import mlx.core as mx
import numpy as np
import pytest
from policy_harness import (
    ACTION_DIM,
    HIGH,
    LOW,
    NUM_ENVS,
    OBS_DIM,
    SAFE,
    SCALE,
    expected_action,
)
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from std_msgs.msg import Float32MultiArray, Float64MultiArray
from std_srvs.srv import SetBool

from unilab_ros.deploy.policy_node import PolicyNode
from unilab_ros.rl import PPOAgent
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.bundle import read_policy, save_bundle
from unilab_ros.rl.checkpoint import save_checkpoint
from unilab_ros.rl.model import ModelConfig
from unilab_ros.ros.messages import read_matrix

pytestmark = pytest.mark.ros


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


def configured(context, checkpoint, **params) -> PolicyNode:
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(checkpoint)),
        *(Parameter(name, value=value) for name, value in params.items()),
    ])
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    return node


def test_the_training_action_mapping_comes_from_the_checkpoint(context, tmp_path):
    agent = PPOAgent(AgentConfig(num_envs=NUM_ENVS, obs_dim=OBS_DIM, action_dim=ACTION_DIM),
                     ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]))
    trained = ActionConfig(action_scale=[2.0], action_low=[-2.0], action_high=[2.0],
                           safe_action=[0.5])
    path = save_checkpoint(tmp_path / "trained", agent, actions=trained)
    node = configured(context, path, num_envs=NUM_ENVS)
    try:
        np.testing.assert_array_equal(node.actions.scale, [2.0, 2.0])
        np.testing.assert_array_equal(node.actions.high, [2.0, 2.0])
        np.testing.assert_array_equal(node.actions.safe, np.full((NUM_ENVS, ACTION_DIM), 0.5))
        # The parameters report the mapping in force, and stay read-only.
        assert list(node.get_parameter("action_high").value) == [2.0]
        assert list(node.get_parameter("safe_action").value) == [0.5]
        assert node.describe_parameter("action_high").read_only
    finally:
        node.destroy_node()
    # A parameter given to the node overrides that one field (and is logged with both).
    node = configured(context, path, num_envs=NUM_ENVS, action_scale=[0.5])
    try:
        np.testing.assert_array_equal(node.actions.scale, [0.5, 0.5])
        np.testing.assert_array_equal(node.actions.high, [2.0, 2.0])
        assert list(node.get_parameter("action_scale").value) == [0.5]
        assert list(node.get_parameter("action_high").value) == [2.0]
    finally:
        node.destroy_node()


def test_a_bundle_is_served_as_the_mlx_deterministic_actor_with_its_mapping(
    make_harness, exported, tmp_path
):
    path, model = exported
    bundle = read_policy(path)
    bundle.actions = ActionConfig(action_scale=SCALE, action_low=LOW, action_high=HIGH,
                                  safe_action=SAFE)
    bundle_path = save_bundle(tmp_path / "bundle", bundle)
    # No action parameters: the mapping is the bundle's.
    harness = make_harness(bundle_path, mapping={})
    rng = np.random.default_rng(5)
    for _ in range(3):
        obs = rng.normal(2.0, 3.0, (NUM_ENVS, OBS_DIM)).astype(np.float32)
        np.testing.assert_allclose(harness.act(obs), expected_action(model, obs),
                                   rtol=1e-5, atol=1e-6)


def test_estop_holds_the_safe_action_then_the_policy_blends_back_in(make_harness, exported):
    path, model = exported
    harness = make_harness(path, blend_in_steps=4)
    obs = np.full((NUM_ENVS, OBS_DIM), 0.3, np.float32)
    safe = np.tile(SAFE, (NUM_ENVS, 1)).astype(np.float32)
    policy = expected_action(model, obs).astype(np.float32)
    assert not np.allclose(policy, safe)
    ramp = [safe + step / 4 * (policy - safe) for step in range(1, 5)]
    for expected in ramp:  # blend-in after activation
        np.testing.assert_allclose(harness.act(obs), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(harness.act(obs), policy, rtol=1e-5, atol=1e-6)
    count = len(harness.action_msgs)
    harness.estop(True)
    # At once, not at the next observation.
    assert harness.spin_until(lambda: len(harness.action_msgs) == count + 1)
    np.testing.assert_allclose(harness.last_action(), safe)
    for _ in range(2):
        np.testing.assert_allclose(harness.act(obs), safe)
    harness.estop(False)
    for expected in ramp:
        np.testing.assert_allclose(harness.act(obs), expected, rtol=1e-5, atol=1e-6)


def test_the_rate_limit_bounds_each_published_change(make_harness, exported):
    path, model = exported
    harness = make_harness(path, max_action_change=[0.05])
    obs = np.full((NUM_ENVS, OBS_DIM), -0.7, np.float32)
    previous = np.tile(SAFE, (NUM_ENVS, 1))
    for _ in range(5):
        action = harness.act(obs)
        assert np.all(np.abs(action - previous) <= 0.05 + 1e-6)
        previous = action
    assert not np.allclose(previous, expected_action(model, obs)), "still on its way"
