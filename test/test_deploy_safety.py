"""The deploy node on a robot spec, issue 41's faults (real rclpy, in process unless said):
the guard in force is the stricter of the spec's and the operator's, in command units; a
robot whose joints do not match never gets it active, whatever the start state; the ONNX
model outputs what the node commands; ~/status counts the commands sent; a shutdown
transition ends the process; a spec with an action scale of 0 stops the trainer."""

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import rclpy
import yaml
from lifecycle_msgs.srv import ChangeState
from policy_harness import PACKAGE_ROOT, SpecRobot, spec_bundle
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from std_msgs.msg import String

from unilab_ros.deploy.policy_node import PolicyNode
from unilab_ros.rl.bundle import read_policy
from unilab_ros.rl.onnx_export import actor_graph

pytestmark = pytest.mark.ros

# The cart-pole's action mapping (scale 10, +-20 N), with a guard of 0.5 policy units a
# step in the spec: 5 N in command units.
EFFORT_SPEC = {
    "name": "effort_pair",
    "control_rate": 50.0,
    "sources": [{"name": "joints", "topic": "joint_states", "type": "joint_state",
                 "max_age": 0.5}],
    "default_pose": {"a": 0.0, "b": 0.0},
    "observation": [{"kind": "joint_pos_rel", "source": "joints", "joints": ["a", "b"]}],
    "rewards": [{"kind": "alive", "weight": 1.0}],
    "terminations": [{"kind": "episode_length", "max_steps": 100000}],
    "actions": {"joints": ["a", "b"], "interface": "effort", "topic": "cmd", "scale": 10.0,
                "low": -20.0, "high": 20.0, "guard": {"max_action_change": [0.5]}},
    "reset": {"mode": "service", "service": "reset"},
}
SPEC_LIMIT_N = 5.0
# A position interface: a non-unit scale, a default pose to offset from, limits that clip.
POSITION_SPEC = {
    **EFFORT_SPEC,
    "name": "position_pair",
    "default_pose": {"a": 0.3, "b": -0.2},
    "actions": {"joints": ["a", "b"], "interface": "position", "topic": "cmd",
                "scale": [0.5, 0.25], "low": [-0.4, -0.6], "high": [0.8, 0.1]},
}
# Float64 arithmetic of offset + scale x action on the robot's side: far below any
# physical meaning, far above float32's rounding of a limit that is not kept.
EXACT = 1e-9


def deploy_params() -> dict:
    """config/deploy.yaml's parameters, as deploy.launch.py passes them."""
    data = yaml.safe_load((PACKAGE_ROOT / "config" / "deploy.yaml").read_text())
    return data["/**/unilab_policy"]["ros__parameters"]


class Rig:
    """A PolicyNode, a SpecRobot and a ~/status listener on one executor."""

    def __init__(self, context, bundle, names=("b", "extra", "a"), **params) -> None:
        params = {**params, "checkpoint": str(bundle)}
        self.node = PolicyNode(context=context, parameter_overrides=[
            Parameter(name, value=value) for name, value in params.items()])
        self.robot = SpecRobot(context, names)
        self.status: dict = {}
        self.robot.node.create_subscription(
            String, "/unilab_policy/status",
            lambda msg: setattr(self, "status", json.loads(msg.data)), 10)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.robot.node)

    def spin_until(self, predicate, timeout=10.0) -> bool:
        return spin_until(self.executor, predicate, timeout)

    def activate(self, before=lambda: None) -> None:
        """Configure, run ``before``, activate once the robot was heard."""
        assert self.node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        before()
        assert self.spin_until(lambda: self.node.robot.link.heard_all)
        assert self.node.trigger_activate() == TransitionCallbackReturn.SUCCESS

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.robot.node.destroy_node()


@pytest.fixture
def make_rig(context):
    rigs = []

    def make(bundle, **options) -> Rig:
        rigs.append(Rig(context, bundle, **options))
        return rigs[-1]

    yield make
    for rig in rigs:
        rig.close()


def steps_of(commands: list[np.ndarray]) -> np.ndarray:
    return np.abs(np.diff(np.stack(commands), axis=0))


def test_the_spec_guard_holds_beside_the_shipped_deploy_yaml_in_command_units(
        make_rig, tmp_path):
    """Issue 41 item 1: config/deploy.yaml's guard keys replaced the spec's guard whole
    (commands jumped 24.8 N where the spec allows 5 N)."""
    rig = make_rig(spec_bundle(tmp_path, EFFORT_SPEC), **deploy_params())
    rig.activate()
    assert rig.spin_until(lambda: len(rig.robot.commands) >= 80, 15.0)
    steps = steps_of(rig.robot.commands)
    assert steps.max() <= SPEC_LIMIT_N + EXACT, steps.max()
    # The policy pushes against the limit (else the check above proves nothing).
    assert (steps >= SPEC_LIMIT_N - 1e-6).sum() >= 5
    assert "a 5, b 5;" in rig.node.limits_in_force
    assert "blend-in 25 steps" in rig.node.limits_in_force


def test_an_operators_limit_is_in_command_units_and_the_stricter_wins(make_rig, tmp_path):
    """Issue 41 item 2: max_action_change 0.5 in a deploy params file let commands move
    5 N a step (read in policy units, scale 10 times looser)."""
    params = {**deploy_params(), "max_action_change": [0.5], "blend_in_steps": 0}
    rig = make_rig(spec_bundle(tmp_path, EFFORT_SPEC), **params)
    rig.activate()
    assert rig.spin_until(lambda: len(rig.robot.commands) >= 60, 15.0)
    steps = steps_of(rig.robot.commands)
    assert steps.max() <= 0.5 + EXACT, steps.max()
    assert (steps >= 0.5 - 1e-6).sum() >= 5
    assert "a 0.5, b 0.5;" in rig.node.limits_in_force


@pytest.mark.parametrize("start_state", ["active", "inactive"])
def test_a_robot_whose_joints_do_not_match_never_gets_the_node_active(
        make_rig, tmp_path, start_state):
    """Issue 41 item 3: with start_state active (deploy.launch.py's default) the node
    activated before any joint state arrived and commanded a robot that was not its own."""
    bundle = spec_bundle(tmp_path, POSITION_SPEC)
    rig = make_rig(bundle, names=("shoulder", "elbow"), start_state=start_state,
                   **deploy_params())
    assert rig.spin_until(lambda: rig.status.get("state") == "inactive", 5.0)
    rig.spin_until(lambda: False, 1.5)
    assert rig.node.state == "inactive"
    assert rig.robot.commands == [], "nothing reaches a robot that is not the spec's"
    if start_state == "active":
        assert "joint(s) ['a', 'b'] not in joint_states" in rig.status["waiting_to_activate"]
    assert rig.node.trigger_activate() != TransitionCallbackReturn.SUCCESS
    assert rig.node.state == "inactive" and rig.robot.commands == []
    # The spec's robot comes up: the waiting start activates, and deactivating sends the
    # position interface's safe command, the default pose (never zeros).
    rig.robot.names = ["b", "a"]
    if start_state == "inactive":
        assert rig.spin_until(lambda: not rig.node.robot.activation_refusal(), 5.0)
        assert rig.node.trigger_activate() == TransitionCallbackReturn.SUCCESS
    assert rig.spin_until(lambda: rig.node.state == "active", 5.0)
    assert rig.spin_until(lambda: len(rig.robot.commands) >= 3, 5.0)
    count = len(rig.robot.commands)
    assert rig.node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert rig.spin_until(lambda: len(rig.robot.commands) == count + 1, 5.0)
    np.testing.assert_array_equal(rig.robot.commands[-1], [0.3, -0.2])


def test_the_start_waits_for_the_robot_to_be_heard(make_rig, tmp_path):
    """Activation needs the joints checked: a silent robot keeps the node inactive."""
    rig = make_rig(spec_bundle(tmp_path, POSITION_SPEC), names=("a", "b"),
                   start_state="active")
    rig.robot.pub.publish = lambda _msg: None
    assert rig.spin_until(lambda: rig.node.state == "inactive", 5.0)
    rig.spin_until(lambda: False, 0.5)
    assert rig.node.state == "inactive"
    assert "nothing heard on ['joint_states']" in rig.node.waiting_to_activate


def test_the_onnx_model_outputs_the_commands_the_node_publishes(make_rig, tmp_path):
    """Issue 41 item 4: the ONNX output was the policy's action, without the spec's scale,
    default-pose offset and joint limits."""
    bundle = spec_bundle(tmp_path, POSITION_SPEC)
    rig = make_rig(bundle, blend_in_steps=0)
    acted_on: list[np.ndarray] = []
    sent: list[np.ndarray | None] = []
    """Per command the deployed robot sent: the observation the policy acted on (None: a
    safe command)."""

    def record() -> None:
        robot = rig.node.robot
        sampler, publish = robot._sampler, robot._publish

        def sample(obs, deterministic):
            acted_on.append(obs.copy())
            return sampler(obs, deterministic)

        def send(command):
            sent.append(acted_on.pop() if acted_on else None)
            publish(command)

        robot._sampler, robot._publish = sample, send

    rig.activate(before=record)
    assert rig.spin_until(lambda: sum(obs is not None for obs in sent) >= 60, 15.0)
    assert rig.node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    # Every command sent, and the deactivation's safe command after them.
    assert rig.spin_until(lambda: len(rig.robot.commands) == len(sent) + 1, 5.0)
    pairs = [(obs, command) for obs, command in zip(sent, rig.robot.commands[:-1],
                                                    strict=True) if obs is not None]
    obs = np.concatenate([obs for obs, _ in pairs]).astype(np.float32)
    published = np.stack([command for _, command in pairs])
    graph = actor_graph(read_policy(bundle))
    session = onnxruntime.InferenceSession(graph.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    onnx_commands = session.run(["action"], {"observation": obs})[0]
    np.testing.assert_allclose(onnx_commands, published, atol=1e-6)
    # Both limits and the interior occur, on a command other than scale x action.
    low, high = [-0.4, -0.6], [0.8, 0.1]
    assert (published == low).any() and (published == high).any()
    assert ((published > low) & (published < high)).mean() > 0.2
    props = {p.key: p.value for p in graph.metadata_props}
    assert props["action_output"].startswith("command:")
    assert json.loads(props["safe_command"]) == [0.3, -0.2]
    assert json.loads(props["command_guard"])["max_action_change"] == [0.0, 0.0]


def test_status_counts_every_command_sent(make_rig, tmp_path):
    """Issue 41 item 9: "actions" stayed 0 after 2,563 commands of a spec robot."""
    rig = make_rig(spec_bundle(tmp_path, EFFORT_SPEC))
    rig.activate()
    assert rig.spin_until(lambda: len(rig.robot.commands) >= 20, 10.0)
    assert rig.node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
    assert rig.spin_until(
        lambda: len(rig.robot.commands) == rig.node.counters["actions"], 5.0)
    assert rig.spin_until(lambda: rig.status.get("state") == "inactive", 3.0)
    assert rig.status["actions"] == len(rig.robot.commands)


def _subprocess_env(ros_domain_env: dict) -> dict:
    return dict(ros_domain_env, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join(
        filter(None, [str(PACKAGE_ROOT), ros_domain_env.get("PYTHONPATH")])))


def test_a_shutdown_transition_ends_the_process(ros_domain_env, context, tmp_path):
    """Issue 41 item 9: after `ros2 lifecycle set ... shutdown` the process stayed alive in
    finalized."""
    bundle = spec_bundle(tmp_path, EFFORT_SPEC)
    process = subprocess.Popen(
        [sys.executable, "-m", "unilab_ros.deploy.policy_node", "--ros-args",
         "-p", f"checkpoint:={bundle}", "-p", "start_state:=inactive"],
        env=_subprocess_env(ros_domain_env), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    operator = rclpy.create_node("operator", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(operator)
    try:
        client = operator.create_client(ChangeState, "/unilab_policy/change_state")
        assert spin_until(executor, client.service_is_ready, 30.0)
        request = ChangeState.Request()
        request.transition.label = "shutdown"
        # A service is "ready" once the client sees it; the server may not see the client
        # yet and drop the request: ask again until answered.
        for _ in range(10):
            future = client.call_async(request)
            if spin_until(executor, lambda f=future: f.done() or process.poll() is not None,
                          2.0):
                break
        assert not future.done() or future.result().success
        assert process.wait(timeout=5.0) == 0
    finally:
        if process.poll() is None:
            process.kill()
        output = process.communicate()[0]
        executor.shutdown()
        operator.destroy_node()
    assert "Traceback" not in output, output


def test_a_spec_with_an_action_scale_of_0_stops_the_trainer_with_one_line(
        ros_domain_env, tmp_path):
    """Issue 41 item 9: `scale: 0.0` was accepted."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**EFFORT_SPEC,
                                    "actions": {**EFFORT_SPEC["actions"], "scale": 0.0}}))
    result = subprocess.run(
        [sys.executable, "-m", "unilab_ros.trainer", "--ros-args",
         "-p", f"robot_spec:={spec}", "-p", f"checkpoint_dir:={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=60, env=_subprocess_env(ros_domain_env),
        cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    output = (result.stdout + result.stderr).strip().splitlines()
    assert len(output) == 1 and "actions.scale[0]: must not be 0" in output[0], output
