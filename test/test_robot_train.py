"""Training and deploying through a robot spec, with real rclpy: a hand-made robot node
publishes sensor_msgs/JointState (its joints out of the spec's order, plus one the spec
does not use), takes Float64MultiArray commands and offers a reset service; the trainer
(or the policy node) reads a small spec from a file.

The step logic is tested without ROS in test_robot_steps.py; these test the wiring: the
control timer, the joint commands, the reset protocol (service and operator), stale data,
a robot whose joints do not match, and the spec's trip through the bundle to deployment.
"""

import json
import time

import numpy as np
import pytest
import rclpy
import yaml
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import Empty, Trigger

import unilab_ros.ros.spec_link as robot_link
from unilab_ros.deploy.policy_node import PolicyNode
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.bundle import load_bundle, read_policy, save_bundle
from unilab_ros.rl.onnx_export import actor_graph
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.payload import robot_payload, spec_of
from unilab_ros.robot.spec import load_spec
from unilab_ros.ros.params import ConfigError
from unilab_ros.trainer.node import TrainerNode
from unilab_ros.trainer.session import SessionConfig, with_robot_spec

pytestmark = pytest.mark.ros

MAX_STEPS = 5
SPEC = {
    "name": "tiny",
    "control_rate": 50.0,
    "sources": [{"name": "joints", "topic": "joint_states", "type": "joint_state",
                 "max_age": 0.1}],
    "default_pose": {"a": 0.5, "b": 0.0},
    "observation": [{"kind": "joint_pos_rel", "source": "joints", "joints": ["a", "b"]},
                    {"kind": "last_action"}],
    "rewards": [{"kind": "alive", "weight": 1.0}],
    "terminations": [{"kind": "episode_length", "max_steps": MAX_STEPS}],
    "actions": {"joints": ["a"], "interface": "effort", "topic": "cmd",
                "output": "float64_multi_array", "scale": 2.0, "low": -1.0, "high": 1.0,
                "safe": 0.25},
    "reset": {"mode": "service", "service": "reset"},
}
SAFE = 0.25


def spec_file(tmp_path, **changes):
    spec = {**SPEC, **changes}
    path = tmp_path / f"spec_{len(list(tmp_path.glob('spec_*')))}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


class FakeRobot:
    """Publishes joint states at 100 Hz (names ``names``) until ``silent``; records the
    commands it gets and the reset calls."""

    def __init__(self, context, names=("extra", "b", "a")):
        self.node = rclpy.create_node("fake_robot", context=context)
        self.names = list(names)
        self.pub = self.node.create_publisher(JointState, "joint_states", 10)
        self.commands: list[np.ndarray] = []
        self.node.create_subscription(Float64MultiArray, "cmd", self._on_command, 10)
        self.resets = 0
        self.node.create_service(Empty, "reset", self._on_reset)
        self.silent = False
        self.position = 0.0
        self.node.create_timer(0.01, self._publish)

    def _on_command(self, msg):
        self.commands.append(np.array(msg.data))
        self.position += 0.01 * float(msg.data[0])

    def _on_reset(self, _request, response):
        self.resets += 1
        self.position = 0.0
        return response

    def _publish(self):
        if self.silent:
            return
        msg = JointState(name=self.names)
        msg.header.stamp = self.node.get_clock().now().to_msg()
        msg.position = [9.0, -0.1, 0.5 + self.position][-len(self.names):]
        msg.velocity = [0.0] * len(self.names)
        self.pub.publish(msg)


class Rig:
    """A node under test, the fake robot and a status listener, on one executor."""

    def __init__(self, context, node, robot):
        self.node, self.robot = node, robot
        self.status: dict = {}
        robot.node.create_subscription(
            String, f"/{node.get_name()}/status",
            lambda msg: setattr(self, "status", json.loads(msg.data)), 10)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(node)
        self.executor.add_node(robot.node)

    def spin_until(self, predicate, timeout=15.0):
        return spin_until(self.executor, predicate, timeout)

    def call(self, client, request):
        assert self.spin_until(client.service_is_ready, 5.0)
        future = client.call_async(request)
        assert self.spin_until(future.done, 5.0)
        return future.result()

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        self.robot.node.destroy_node()


def trainer(context, tmp_path, spec, **overrides):
    params = {"robot_spec": str(spec), "num_steps": 8, "tensorboard": False,
              "checkpoint_dir": str(tmp_path / "run"), "warm_up_update": False,
              "model.actor_hidden_dims": [8], "model.critic_hidden_dims": [8],
              "ppo.num_mini_batches": 1, "ppo.num_learning_epochs": 1,
              "update_trigger": "episode_end", "obs_timeout": 5.0, **overrides}
    return TrainerNode(context=context, parameter_overrides=[
        Parameter(name, value=value) for name, value in params.items()])


@pytest.fixture
def rig_factory(context):
    rigs = []

    def make(node, robot):
        rigs.append(Rig(context, node, robot))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.close()


def test_the_trainer_acts_by_joint_name_resets_the_robot_and_updates(
        context, tmp_path, rig_factory):
    robot = FakeRobot(context)
    rig = rig_factory(trainer(context, tmp_path, spec_file(tmp_path)), robot)
    loop = rig.node.loop
    assert rig.node.obs_dim == 3 and rig.node.agent.cfg.action_dim == 1
    assert rig.spin_until(lambda: loop.agent.iteration >= 1 and robot.resets >= 2, 30.0)
    # Every command is one joint's effort within the spec's limits: scale 2 x action,
    # clipped to [-1, 1]; the safe one (0.25) between episodes.
    values = np.concatenate(robot.commands)
    assert values.size == len(robot.commands) and np.all(np.abs(values) <= 1.0)
    assert np.any(values != SAFE) and np.any(values == SAFE)
    # Each episode is MAX_STEPS control steps, ended as a time-out, then reset.
    steps = loop.robots[0].source
    assert steps.counters["time_outs"] >= 2 and steps.counters["failures"] == 0
    assert rig.spin_until(lambda: "robots" in rig.status, 3.0)
    # The fake robot shares the executor, so it is silent while an update runs (seconds
    # under load): the age is read once its next messages are in.
    def link() -> dict:
        return json.loads(json.dumps(rig.node.status()))["robots"]["tiny"]
    assert rig.spin_until(lambda: 0.0 <= link()["ages"]["joints"] < 0.1, 3.0), link()["ages"]
    assert link()["reset_calls"] >= 2 and link()["joint_error"] == ""
    assert link()["period_jitter"]["p50_ms"] is not None
    # On the wall clock each tick waits to the spin margin after its timer's schedule.
    wake = link()["timer_wake"]
    assert wake["margin_ms"] == 1.0 and wake["late_p50_ms"] >= 0.0
    # The trained policy carries the spec: checkpoints and bundles.
    path = rig.node.artifacts.export_bundle("test")
    bundle = load_bundle(path)
    assert spec_of(bundle.robot, bundle.obs_dim, bundle.action_dim) == load_spec(
        spec_file(tmp_path))
    saved = rig.node.save("test")
    assert read_policy(saved).robot == bundle.robot


def test_stale_joint_states_send_the_safe_command_and_cut_the_step(
        context, tmp_path, rig_factory):
    robot = FakeRobot(context)
    spec = spec_file(tmp_path, terminations=[{"kind": "episode_length", "max_steps": 1000}])
    rig = rig_factory(trainer(context, tmp_path, spec, num_steps=1000), robot)
    steps = rig.node.loop.robots[0].source
    assert rig.spin_until(lambda: steps.counters["steps_completed"] >= 2)
    robot.silent = True
    # The step in progress is cut as a time-out (stale data, or its deadline of 3 control
    # periods) and the episode ends; the robot is reset and the trainer waits for data
    # newer than the reset, holding the safe command.
    assert rig.spin_until(lambda: steps.counters["steps_dropped"] >= 1)
    assert rig.spin_until(lambda: steps.counters["waiting_ticks"] >= 5)
    assert steps.counters["time_outs"] >= 1 and robot.resets >= 1
    assert steps.waiting == ["joints"]
    heard = len(robot.commands)
    assert rig.spin_until(lambda: len(robot.commands) >= heard + 3)
    assert all(command[0] == SAFE for command in robot.commands[heard:])
    robot.silent = False
    completed = steps.counters["steps_completed"]
    assert rig.spin_until(lambda: steps.counters["steps_completed"] > completed + 2)
    assert not steps.waiting


def test_the_status_runs_in_the_control_loops_slack_right_after_a_tick(
        context, tmp_path, rig_factory):
    spec = spec_file(tmp_path, terminations=[{"kind": "episode_length", "max_steps": 1000}])
    rig = rig_factory(trainer(context, tmp_path, spec, num_steps=1000), FakeRobot(context))
    link = rig.node._robots[0].input.link
    steps = rig.node.loop.robots[0].source
    assert rig.spin_until(lambda: steps.counters["steps_completed"] >= 2)
    events: list[str] = []
    on_tick = link._on_tick
    link._on_tick = lambda now: (events.append("tick"), on_tick(now))
    # Queued while ticking: run once, after the next tick and before the one after.
    assert link.in_slack(lambda: events.append("work"))
    assert rig.spin_until(lambda: events.count("tick") >= 3)
    assert events.count("work") == 1 and events[:2] == ["tick", "work"]
    # A loop that stopped ticking (paused sim time, say) leaves the work to the caller.
    link.timer.cancel()
    rig.spin_until(lambda: False, 0.2)
    assert not link.in_slack(lambda: events.append("late"))
    rig.spin_until(lambda: False, 0.1)
    assert "late" not in events


def test_an_operator_reset_waits_for_ready(context, tmp_path, rig_factory):
    robot = FakeRobot(context)
    spec = spec_file(tmp_path, reset={"mode": "operator"})
    rig = rig_factory(trainer(context, tmp_path, spec, num_steps=1000), robot)
    steps = rig.node.loop.robots[0].source
    assert rig.spin_until(lambda: steps.needs_reset)
    time.sleep(0.1)
    held = len(robot.commands)
    assert rig.spin_until(lambda: len(robot.commands) >= held + 5)
    assert steps.needs_reset and robot.resets == 0
    assert all(command[0] == SAFE for command in robot.commands[held:])
    ready = robot.node.create_client(Trigger, "/unilab_trainer/ready")
    answer = rig.call(ready, Trigger.Request())
    assert answer.success, answer.message
    assert rig.spin_until(lambda: steps.episode_step >= 2)
    assert not rig.call(ready, Trigger.Request()).success


def test_a_robot_without_a_spec_joint_is_named_and_never_commanded_by_the_policy(
        context, tmp_path, rig_factory):
    robot = FakeRobot(context, names=("b", "c"))
    rig = rig_factory(trainer(context, tmp_path, spec_file(tmp_path)), robot)
    link = rig.node._robots[0].input.link
    assert rig.spin_until(lambda: link.joint_error)
    assert "'a'" in link.joint_error
    rig.spin_until(lambda: False, 0.5)
    assert rig.node.loop.robots[0].source.counters["steps_completed"] == 0
    assert all(command[0] == SAFE for command in robot.commands)


@pytest.fixture
def tiny_bundle(context, tmp_path, rig_factory):
    """A bundle trained briefly on the fake robot (carrying the spec)."""
    robot = FakeRobot(context)
    rig = rig_factory(trainer(context, tmp_path, spec_file(tmp_path)), robot)
    assert rig.spin_until(lambda: rig.node.loop.agent.iteration >= 1, 30.0)
    return rig.node.artifacts.export_bundle("test")


def policy(context, bundle, **overrides):
    params = {"checkpoint": str(bundle), **overrides}
    return PolicyNode(context=context, parameter_overrides=[
        Parameter(name, value=value) for name, value in params.items()])


def configured(context, bundle, rig_factory, names):
    """A policy node configured with ``bundle`` beside a fake robot of joints ``names``."""
    robot = FakeRobot(context, names=names)
    node = policy(context, bundle)
    rig = rig_factory(node, robot)
    node.trigger_configure()
    return node, rig, robot


def test_the_deployed_policy_builds_the_spec_observation_and_commands_joints(
        context, tiny_bundle, rig_factory):
    node, rig, robot = configured(context, tiny_bundle, rig_factory, ("a", "b"))
    assert rig.spin_until(lambda: node.robot.link.heard_all)
    node.trigger_activate()
    assert node.state == "active"
    assert rig.spin_until(lambda: len(robot.commands) >= 20)
    assert rig.spin_until(lambda: rig.status.get("robot", {}).get("episodes", 0) >= 1, 5.0)
    # Time-outs start the next episode at once; every alive step earns dt.
    returns = rig.status["robot"]["episode_returns"]
    assert returns[0] == pytest.approx(MAX_STEPS * 0.02)
    values = np.concatenate(robot.commands)
    assert np.all(np.abs(values) <= 1.0)
    assert node.robot.steps.observation.dim == 3
    # The deploy node's loop waits to the same spin margin on the wall clock.
    assert rig.status["robot"]["timer_wake"]["margin_ms"] == 1.0
    assert rig.status["robot"]["timer_wake"]["late_p50_ms"] >= 0.0


def test_deploy_refuses_a_robot_whose_joints_do_not_match(context, tiny_bundle, rig_factory):
    node, rig, robot = configured(context, tiny_bundle, rig_factory, ("b", "wrist"))
    assert rig.spin_until(lambda: node.robot.link.joint_error)
    node.trigger_activate()
    assert node.state == "inactive"
    assert all(command[0] == SAFE for command in robot.commands)


def test_the_spec_travels_through_the_bundle_and_the_onnx_metadata(tiny_bundle, tmp_path):
    bundle = load_bundle(tiny_bundle)
    spec = spec_of(bundle.robot, bundle.obs_dim, bundle.action_dim)
    assert spec.actions.joints == ("a",) and spec.default_pose == {"a": 0.5, "b": 0.0}
    again = load_bundle(save_bundle(tmp_path / "again", bundle))
    assert again.robot == bundle.robot == robot_payload(spec)
    props = {p.key: p.value for p in actor_graph(bundle).metadata_props}
    layout = json.loads(props["robot_observation"])
    assert [(s["term"], s["start"], s["stop"], s["joints"]) for s in layout["slices"]] == [
        ("joint_pos_rel", 0, 2, ["a", "b"]), ("last_action", 2, 3, [])]
    assert json.loads(props["robot_spec"])["name"] == "tiny"
    with pytest.raises(ValueError, match="makes obs 3 -> action 1"):
        spec_of(bundle.robot, 4, 1)


def test_a_spec_error_names_the_field_and_the_trainer_refuses_to_start(context, tmp_path):
    broken = spec_file(tmp_path, observation=[{"kind": "joint_pos_rel", "source": "joints",
                                               "joints": ["a", "knee"]}])
    with pytest.raises(ConfigError, match=r"observation\[0\]\.joints\[1\]: 'knee'"):
        trainer(context, tmp_path, broken)


def test_the_spec_mapping_replaces_action_parameters_given_beside_it(context, tmp_path,
                                                                    rig_factory):
    node = trainer(context, tmp_path, spec_file(tmp_path), action_scale=[3.0])
    rig_factory(node, FakeRobot(context))
    assert node.loop.actions.scale.tolist() == [1.0]
    assert node.loop.actions.high.tolist() == [0.5] and node.loop.actions.low.tolist() == [-0.5]
    assert node.loop.actions.safe.tolist() == [[0.125]]


def test_absurd_values_are_rejected_and_counted_once_for_status_and_progress_line(
        context, tmp_path, rig_factory):
    """Issue 41 (8, 9): 1e150 positions reached the reward (-inf, an update lost), and the
    progress line said "rejected 0" while ~/status counted thousands."""
    robot = FakeRobot(context)
    spec = spec_file(tmp_path, terminations=[{"kind": "episode_length", "max_steps": 1000}])
    rig = rig_factory(trainer(context, tmp_path, spec, num_steps=1000), robot)
    steps = rig.node.loop.robots[0].source
    assert rig.spin_until(lambda: steps.counters["steps_completed"] >= 2)
    robot.position = 1e150
    assert rig.spin_until(lambda: steps.counters["rejected_messages"] >= 5)
    assert rig.node.status()["rejected_messages"] == steps.counters["rejected_messages"]
    assert rig.node.status()["robots"]["tiny"]["rejected_messages"] >= 5
    rig.node.report.values({})
    line = rig.node.report.line({"update_time": 0.0, "approx_kl": 0.0, "approx_kl_max": 0.0,
                                 "learning_rate_min": 0.0, "learning_rate_max": 0.0})
    assert line.endswith(f"rejected {rig.node.status()['rejected_messages']}"), line


def test_parameters_show_the_sizes_mapping_and_message_the_spec_decided(
        context, tmp_path, rig_factory):
    """Issue 41 (9): `ros2 param get/dump` showed the params file's obs_dim, action limits
    and float32 while the spec ran others; a dump reused as a params file must start the
    same run, without a note that anything was replaced."""
    node = trainer(context, tmp_path, spec_file(tmp_path))
    rig_factory(node, FakeRobot(context))
    shown = {name: node.get_parameter(name).value for name in (
        "obs_dim", "action_dim", "action_scale", "action_low", "action_high", "safe_action",
        "action_msg_type")}
    assert shown["obs_dim"] == 3 and shown["action_dim"] == 1
    assert list(shown["action_scale"]) == [2.0] and list(shown["safe_action"]) == [SAFE]
    assert list(shown["action_low"]) == [-1.0] and list(shown["action_high"]) == [1.0]
    assert shown["action_msg_type"] == "float64"
    dumped = ActionConfig(*(list(shown[k]) for k in ("action_scale", "action_low",
                                                       "action_high", "safe_action")))
    spec = load_spec(spec_file(tmp_path))
    cfg, notes = with_robot_spec(SessionConfig(agent=AgentConfig(obs_dim=3, action_dim=1),
                                               actions=dumped), spec)
    assert notes == [] and cfg.actions == JointCommands(spec).action_config()


def test_a_missing_joint_is_an_error_repeated_while_waiting_and_throttled(
        context, tmp_path, rig_factory, monkeypatch):
    """Issue 41 (9): one error, then "waiting for the first observation" for ever; and the
    mismatch ERROR was not throttled (351 lines in 5 s)."""
    monkeypatch.setattr(robot_link, "WARN_PERIOD", 0.3)
    robot = FakeRobot(context, names=("b", "c"))
    rig = rig_factory(trainer(context, tmp_path, spec_file(tmp_path)), robot)
    link = rig.node._robots[0].input.link
    lines: list[str] = []
    logger = rig.node.get_logger()
    monkeypatch.setattr(rig.node, "get_logger", lambda: type("L", (), {
        "error": lambda _self, text: lines.append(text),
        "warning": logger.warning, "info": logger.info})())
    rig.spin_until(lambda: False, 1.6)
    errors = [line for line in lines if "['a'] not in joint_states" in line]
    # 100 messages a second for 1.6 s; one line per 0.3 s.
    assert 3 <= len(errors) <= 7, lines
    assert link.counters["joint_mismatches"] >= 100
    assert "'a'" in rig.node.status()["robots"]["tiny"]["joint_error"]


def test_a_stamp_ahead_of_a_backlogged_clock_is_held_not_rejected(
        context, tmp_path, rig_factory):
    """Issue 41 (7): after every update one joint state was refused as "ahead of the node
    clock: the publisher uses another clock": its /clock was still queued behind it. It is
    held until the clock catches up; one from another clock is still refused."""
    robot = FakeRobot(context)
    spec = spec_file(tmp_path, terminations=[{"kind": "episode_length", "max_steps": 1000}])
    rig = rig_factory(trainer(context, tmp_path, spec, num_steps=1000), robot)
    link = rig.node._robots[0].input.link
    steps = rig.node.loop.robots[0].source
    assert rig.spin_until(lambda: steps.counters["steps_completed"] >= 2)
    ahead = JointState(name=robot.names, position=[9.0, -0.1, 0.5], velocity=[0.0] * 3)
    ahead.header.stamp = (rig.node.get_clock().now() + rclpy.duration.Duration(seconds=1.5)
                          ).to_msg()
    link._on_message("joints", "joint_state", ahead)
    assert link.counters["held_ahead_of_clock"] == 1
    assert rig.spin_until(lambda: "joints" not in link._held, 3.0)
    assert steps.counters["rejected_messages"] == 0
    # A publisher whose every stamp is far ahead: refused once the grace is over.
    robot.silent = True
    far = JointState(name=robot.names, position=[9.0, -0.1, 0.5], velocity=[0.0] * 3)
    far.header.stamp.sec = 2_000_000_000
    link._on_message("joints", "joint_state", far)
    rig.spin_until(lambda: False, 1.2)
    link._on_message("joints", "joint_state", far)
    assert steps.counters["rejected_messages"] == 1


def test_stale_data_from_sim_time_tells_a_wall_clock_node_about_use_sim_time():
    """Issue 41 (9): run without use_sim_time against a sim-clock robot, the stale-data
    warning gave no hint."""
    from unilab_ros.trainer.spec_training import stale_line
    wall = stale_line({"joints": 1.7e9}, sim_time=False)
    assert "use_sim_time:=true" in wall
    assert "use_sim_time" not in stale_line({"joints": 0.15}, sim_time=False)
    assert "another clock" in stale_line({"joints": 5e4}, sim_time=True)
