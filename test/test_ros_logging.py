"""One log stream: the core's Python log records reach the ROS console format, /rosout,
and follow ``--log-level``."""

import subprocess

import pytest
import rclpy
from rcl_interfaces.msg import Log
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import spin_until
from std_msgs.msg import String
from test_shutdown import PENDULUM_YAML, SMALL

from unilab_ros.tools.sim_train import node_command

pytestmark = pytest.mark.ros
CORE_LINE = "rl.activations: ELU:"
"""What the core logs (Python logging, at INFO) when the trainer builds its model."""


def run_trainer(tmp_path, env, context, log_level: str, received: list | None = None) -> str:
    """Start a trainer, stop it once its status shows it is up; its stderr. With
    ``received``, also collect what /rosout carries meanwhile."""
    node = rclpy.create_node("log_test_peer", context=context)
    statuses: list[String] = []
    node.create_subscription(String, "/unilab_trainer/status", statuses.append, 10)
    if received is not None:
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        node.create_subscription(Log, "/rosout", received.append, qos)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    command = node_command("unilab_ros.trainer", PENDULUM_YAML, {
        **SMALL, "warm_up_update": "false", "checkpoint_dir": str(tmp_path / log_level)})
    command += ["--log-level", f"unilab_trainer:={log_level}"]
    log = tmp_path / f"{log_level}.log"
    with open(log, "w") as stderr:
        process = subprocess.Popen(command, env=env, stderr=stderr)
        try:
            assert spin_until(executor, lambda: statuses, 60.0), "the trainer never came up"
            spin_until(executor, lambda: False, 0.5)
        finally:
            process.terminate()
            process.wait(timeout=30.0)
            executor.shutdown()
            node.destroy_node()
    return log.read_text()


def test_core_log_records_reach_rosout_in_the_ros_format(tmp_path, ros_domain_env, context):
    received: list[Log] = []
    stderr = run_trainer(tmp_path, ros_domain_env, context, "info", received)
    assert f"[unilab_trainer]: {CORE_LINE}" in stderr and "[INFO]" in stderr, stderr
    assert any(log.name == "unilab_trainer" and CORE_LINE in log.msg for log in received)


def test_the_log_level_applies_to_the_core(tmp_path, ros_domain_env, context):
    stderr = run_trainer(tmp_path, ros_domain_env, context, "warn")
    assert "ready:" not in stderr and CORE_LINE not in stderr, stderr


def test_debug_shows_more_than_info(tmp_path, ros_domain_env, context):
    assert "[DEBUG]" in run_trainer(tmp_path, ros_domain_env, context, "debug")
