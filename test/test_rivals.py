"""Two trainers on one robot (one namespace): the newcomer refuses to run, naming the
other; the one that was there first stops acting and learning while another node sends
commands."""

import threading
import time

import numpy as np
import pytest
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.qos import QoSProfile
from ros_helpers import spin_until
from std_msgs.msg import Float32MultiArray
from test_sim_pause import TINY_TRAINER, overrides

from unilab_ros.ros.action_output import ActionOutput, ActionOutputConfig
from unilab_ros.ros.graph_checks import LIVE_WINDOW, UNNAMED_MIN_COMMANDS, RivalWatch
from unilab_ros.ros.messages import to_float32_msg
from unilab_ros.sims.gym_env_node import GymEnvNode
from unilab_ros.trainer.node import NEWCOMER_WINDOW, TrainerNode

pytestmark = pytest.mark.ros


def test_the_newcomer_refuses_and_the_first_trainer_waits_until_it_is_gone(context, tmp_path):
    bridge = GymEnvNode(context=context, parameter_overrides=overrides({
        "num_envs": 2, "republish_period": 0.1}))
    bridge_executor, executor = (SingleThreadedExecutor(context=context) for _ in "ab")
    bridge_executor.add_node(bridge)
    thread = threading.Thread(target=bridge_executor.spin, daemon=True)
    thread.start()
    params = {**TINY_TRAINER, "step_timeout": 0.5}
    first = TrainerNode(context=context, parameter_overrides=overrides(
        {**params, "checkpoint_dir": str(tmp_path / "first")}))
    newcomer = None
    try:
        executor.add_node(first)
        assert spin_until(executor, lambda: first.loop.step_counters["steps_completed"] > 5,
                          20.0)
        # As if it had run for a while, as a trainer that another one joins has.
        first._started -= NEWCOMER_WINDOW
        newcomer = TrainerNode(context=context, parameter_overrides=overrides(
            {**params, "checkpoint_dir": str(tmp_path / "newcomer")}))
        executor.add_node(newcomer)
        assert spin_until(executor, lambda: newcomer.finished, 10.0), "the newcomer ran on"
        assert newcomer.exit_code == 2 and first.exit_code == 0
        executor.remove_node(newcomer)
        newcomer.destroy_node()
        newcomer = None
        # The first trainer goes on; a node that sends commands on its topic stops its
        # acting until that node falls silent.
        steps = first.loop.step_counters["steps_completed"]
        assert spin_until(executor, lambda: first.loop.step_counters["steps_completed"]
                          > steps + 5, 10.0), (first._hold.rivals, first.exit_code)
        peer = rclpy.create_node("rival_commander", context=context)
        rival = peer.create_publisher(Float32MultiArray, "action", 10)
        command = to_float32_msg(np.zeros((2, 1), np.float32), ("env", "action"))
        executor.add_node(peer)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and not first._hold.rivals:
            rival.publish(command)
            spin_until(executor, lambda: False, 0.05)
        rivals = first._hold.rivals
        assert any("/rival_commander" in line for line in rivals), rivals
        # The rival goes on commanding the robot, whose steps arrive: none is learned from
        # (before, the trainer stored them and updated on them while "acting stopped").
        recorded, updates = first.agent.env_steps, first.loop.updates_run
        steps = first.loop.step_counters["steps_completed"]
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            rival.publish(command)
            spin_until(executor, lambda: False, 0.02)
        assert first.loop.step_counters["steps_completed"] > steps + 10, "no rival's steps"
        assert first._hold.rivals, "the rival was lost while it still commanded"
        assert (first.agent.env_steps, first.loop.updates_run) == (recorded, updates)
        status = first.status()
        assert status["rival_holds"] == 1 and status["rival_steps_not_learned"] > 10
        assert status["estops"] == 0
        executor.remove_node(peer)
        peer.destroy_node()
        assert spin_until(executor, lambda: not first._hold.rivals, LIVE_WINDOW + 5.0)
        assert spin_until(executor, lambda: first.agent.env_steps > recorded + 10, 10.0), (
            "the first trainer did not act and learn again")
    finally:
        bridge_executor.shutdown()
        executor.shutdown()
        thread.join(timeout=5.0)
        for node in (first, newcomer, bridge):
            if node is not None:
                node.destroy_node()


def test_a_lone_stray_command_is_no_rival_but_a_steady_unnamed_stream_is(context):
    """A rival the graph does not name yet is known only by its commands: it takes a
    steady stream of them (``UNNAMED_MIN_COMMANDS`` within ``LIVE_WINDOW``); one stray
    sample stopped a healthy CI run for 2 s and dropped its steps."""
    node = rclpy.create_node("watcher", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    output = ActionOutput(node, ActionOutputConfig(), QoSProfile(depth=10))
    watch = RivalWatch(node, [output], listen_for=60.0)
    stray = output.wire(np.full((2, 1), 0.25, np.float32))
    try:
        # Its own commands come back on the topic and never count.
        for value in range(2 * UNNAMED_MIN_COMMANDS):
            watch.publish(0, np.full((2, 1), value, np.float32))
        spin_until(executor, lambda: False, 0.3)
        assert watch.check() == []
        # What the subscription hands over for a command no publisher in the graph sent.
        watch._heard(stray)
        assert watch.check() == []
        for _ in range(UNNAMED_MIN_COMMANDS - 1):
            watch._heard(stray)
        assert watch.check() == ["commands arrive from a publisher the ROS graph does not "
                                 "name yet"]
        time.sleep(LIVE_WINDOW + 0.1)
        assert watch.check() == [], "a stream that stopped is no rival any more"
    finally:
        watch.close()
        executor.shutdown()
        node.destroy_node()
