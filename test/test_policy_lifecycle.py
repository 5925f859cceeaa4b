"""PolicyNode's lifecycle with real rclpy (``policy_harness``): configure failures and
config errors, the start state it takes itself, the transitions and what each publishes,
the exit code of its main, and a rival commander blocking activation."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
from policy_harness import (
    ACTION_DIM,
    NUM_ENVS,
    OBS_DIM,
    PACKAGE_ROOT,
    SAFE,
    expected_action,
)
from rclpy.executors import SingleThreadedExecutor
from rclpy.experimental.events_executor import EventsExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from std_msgs.msg import Float32MultiArray

from unilab_ros.deploy.policy_node import PolicyNode
from unilab_ros.ros.graph_checks import LIVE_WINDOW
from unilab_ros.ros.messages import to_float32_msg
from unilab_ros.ros.params import ConfigError

pytestmark = pytest.mark.ros


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
            "unilab_ros.deploy.policy_node",
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
