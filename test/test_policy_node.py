"""PolicyNode with real rclpy: a policy exported from a small PPOAgent, driven in-process.

The node is a lifecycle node: the harness configures and activates it as a launch would.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.experimental.events_executor import EventsExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from std_msgs.msg import Bool, Float32MultiArray, Float64MultiArray
from std_srvs.srv import SetBool

from unilab_ros.graph_checks import LIVE_WINDOW
from unilab_ros.messages import read_matrix, to_float32_msg
from unilab_ros.params import ConfigError
from unilab_ros.policy_node import PolicyNode
from unilab_ros.rl import PPOAgent
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.bundle import read_policy, save_bundle
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


MAPPING = {"action_scale": SCALE, "action_low": LOW, "action_high": HIGH, "safe_action": SAFE}


class Harness:
    def __init__(self, context: rclpy.Context, checkpoint: Path, activate: bool = True,
                 mapping: dict | None = None, **overrides) -> None:
        params = {
            "checkpoint": str(checkpoint),
            "num_envs": NUM_ENVS,
            **(MAPPING if mapping is None else mapping),
            "obs_timeout": 10.0,
            **overrides,
        }
        self.node = PolicyNode(
            context=context,
            parameter_overrides=[Parameter(name, value=value) for name, value in params.items()],
        )
        if activate:
            assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
            assert self.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        self.peer = rclpy.create_node("policy_test_peer", context=context)
        self.estop_pub = self.peer.create_publisher(Bool, "estop", 10)
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
        assert self.spin_until(lambda: self.estop_pub.get_subscription_count() > 0)
        if activate:
            self.wait_for_action_topic()

    def wait_for_action_topic(self) -> None:
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
        return self.last_action()

    def last_action(self) -> np.ndarray:
        return read_matrix(self.action_msgs[-1], NUM_ENVS, ACTION_DIM)

    def no_action_for(self, obs: np.ndarray) -> bool:
        """True when an observation gets no action (within a short wait)."""
        count = len(self.action_msgs)
        self.obs_pub.publish(to_float32_msg(obs, ("env", "obs")))
        return not self.spin_until(lambda: len(self.action_msgs) > count, timeout=0.3)

    def estop(self, engaged: bool) -> None:
        count = self.node.counters["estops"]
        self.estop_pub.publish(Bool(data=engaged))
        assert self.spin_until(lambda: self.node.estopped == engaged)
        assert self.node.counters["estops"] == count + engaged

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.peer.destroy_node()


@pytest.fixture
def make_harness(context):
    made = []

    def make(checkpoint, **options) -> Harness:
        made.append(Harness(context, checkpoint, **options))
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


def test_a_missing_policy_file_fails_configure_and_names_no_file_a_config_error(
    context, tmp_path
):
    missing = tmp_path / "missing.safetensors"
    node = PolicyNode(
        context=context, parameter_overrides=[Parameter("checkpoint", value=str(missing))]
    )
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
        assert node.state == "unconfigured"
    finally:
        node.destroy_node()
    with pytest.raises(ConfigError, match="checkpoint must name"):
        PolicyNode(context=context)


@pytest.mark.parametrize("executor_type", [SingleThreadedExecutor, EventsExecutor])
@pytest.mark.parametrize("start_state", ["inactive", "active"])
def test_start_state_takes_the_node_there_itself_once_spinning(context, exported, start_state,
                                                               executor_type):
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(exported[0])),
        Parameter("start_state", value=start_state)])
    configures = []
    trigger_configure = node.trigger_configure
    node.trigger_configure = lambda: configures.append(1) or trigger_configure()
    executor = executor_type(context=context)
    executor.add_node(node)
    try:
        assert node.state == "unconfigured"
        assert spin_until(executor, lambda: node.state == start_state, timeout=10.0)
        for _ in range(5):  # and it stays there: the start is one shot
            executor.spin_once(timeout_sec=0.01)
        assert node.state == start_state
        # The EventsExecutor queues a zero-period timer's events before the first callback
        # cancels it: a second configure would log an error on an active node.
        assert len(configures) == 1
    finally:
        executor.shutdown()
        node.destroy_node()


def test_a_start_state_whose_configure_fails_stays_unconfigured(context, tmp_path):
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(tmp_path / "missing.safetensors")),
        Parameter("start_state", value="active")])
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        for _ in range(5):
            executor.spin_once(timeout_sec=0.05)
        assert node.state == "unconfigured"
    finally:
        executor.shutdown()
        node.destroy_node()
    with pytest.raises(ConfigError, match="start_state must be one of"):
        PolicyNode(context=context, parameter_overrides=[
            Parameter("checkpoint", value="policy.safetensors"),
            Parameter("start_state", value="running")])


def configured(context, checkpoint, **params) -> PolicyNode:
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(checkpoint)),
        *(Parameter(name, value=value) for name, value in params.items()),
    ])
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    return node


def test_action_limits_of_the_wrong_size_fail_configure(context, exported):
    node = PolicyNode(context=context, parameter_overrides=[
        Parameter("checkpoint", value=str(exported[0])),
        Parameter("action_scale", value=[1.0, 1.0, 1.0]),
    ])
    try:
        assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    finally:
        node.destroy_node()


def test_main_exits_2_with_a_one_line_reason_without_a_checkpoint(ros_domain_env, tmp_path):
    # The params file leaves checkpoint empty: a bad value is refused at start, before any
    # lifecycle transition (a missing file only fails configure, see above).
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
    assert len(output) == 1 and "checkpoint must name" in output[0], output


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


def test_lifecycle_configure_activate_deactivate_cleanup_shutdown(make_harness, exported):
    harness = make_harness(exported[0], activate=False)
    node = harness.node
    obs = np.ones((NUM_ENVS, OBS_DIM), np.float32)
    safe = np.tile(SAFE, (NUM_ENVS, 1))
    assert node.state == "unconfigured"
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    harness.wait_for_action_topic()
    assert node.state == "inactive" and harness.no_action_for(obs), "inactive: no commands"
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    np.testing.assert_allclose(harness.act(obs), expected_action(exported[1], obs), rtol=1e-5)
    count = len(harness.action_msgs)
    assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert harness.spin_until(lambda: len(harness.action_msgs) == count + 1)
    np.testing.assert_allclose(harness.last_action(), safe)
    assert harness.no_action_for(obs), "deactivated: commanding stopped"
    assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
    assert node.state == "unconfigured" and not hasattr(node, "model")
    # Configured again from scratch, then shut down while active: the safe action goes out.
    assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    harness.wait_for_action_topic()
    harness.act(obs)
    count = len(harness.action_msgs)
    assert node.trigger_shutdown() == TransitionCallbackReturn.SUCCESS
    assert harness.spin_until(lambda: len(harness.action_msgs) == count + 1)
    np.testing.assert_allclose(harness.last_action(), safe)
    assert node.state == "finalized"


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


def test_another_node_commanding_the_robot_blocks_activation(make_harness, exported):
    harness = make_harness(exported[0], activate=False)
    rival = harness.peer.create_publisher(Float32MultiArray, "action", 10)
    assert harness.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
    command = to_float32_msg(np.zeros((NUM_ENVS, ACTION_DIM), np.float32), ("env", "action"))
    harness.node.trigger_activate()  # the first check starts listening on the topic
    harness.node.trigger_deactivate()
    # A publisher that sends nothing (e.g. a killed process's ghost) is no rival; one that
    # commands is.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        rival.publish(command)
        harness.spin_until(lambda: False, 0.05)
    assert harness.node.trigger_activate() != TransitionCallbackReturn.SUCCESS
    assert harness.node.state == "inactive"
    harness.peer.destroy_publisher(rival)
    assert harness.spin_until(lambda: harness.node.count_publishers("action") == 1)
    harness.spin_until(lambda: False, LIVE_WINDOW + 0.1)
    assert harness.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
