"""The policy node under test: a small exported policy and a harness that drives a
PolicyNode in process with real rclpy (a peer node publishes observations and e-stops and
records the actions). The node is a lifecycle node: the harness configures and activates
it as a launch would. For a robot spec's policy: ``spec_bundle`` (an untrained policy
carrying a spec) and ``SpecRobot`` (joint states in, joint commands recorded)."""

from pathlib import Path

import mlx.core as mx
import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float32MultiArray, Float64MultiArray

from unilab_ros.deploy.policy_node import PolicyNode
from unilab_ros.rl import PPOAgent
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.bundle import bundle_from_agent, save_bundle
from unilab_ros.rl.checkpoint import export_policy
from unilab_ros.rl.model import ModelConfig
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.payload import robot_payload
from unilab_ros.robot.spec import spec_from_dict
from unilab_ros.ros.messages import read_matrix, to_float32_msg

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, OBS_DIM, ACTION_DIM = 2, 3, 2
SCALE, LOW, HIGH, SAFE = [2.0, 0.5], [-1.0, -0.4], [1.0, 0.4], [0.1, -0.2]
WAIT_S = 5.0
MAPPING = {"action_scale": SCALE, "action_low": LOW, "action_high": HIGH, "safe_action": SAFE}


def _loud_agent(obs_dim: int, action_dim: int, num_envs: int, gain: float) -> PPOAgent:
    agent = PPOAgent(
        AgentConfig(num_envs=num_envs, obs_dim=obs_dim, action_dim=action_dim, seed=3),
        ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
    )
    last = agent.model.actor.layers[-1]
    # The output layer is initialised with gain 0.01: near-zero means would prove nothing.
    last.weight = last.weight * gain
    return agent


def export_test_policy(folder: Path):
    """(path, model) of a policy whose mean actions are O(1), so scaling and clipping both
    show."""
    agent = _loud_agent(OBS_DIM, ACTION_DIM, NUM_ENVS, 300.0)
    # Non-trivial normalizer statistics: the export must carry them.
    agent.model.normalizer.update(mx.array(np.random.default_rng(1).normal(2.0, 3.0, (64, 3))))
    mx.eval(agent.model.parameters())
    return export_policy(folder / "policy", agent), agent.model


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


def expected_action(model, obs: np.ndarray) -> np.ndarray:
    mean = np.array(model.policy(mx.array(obs)))
    return np.clip(np.asarray(SCALE) * mean, LOW, HIGH)


def spec_bundle(folder: Path, spec: dict, gain: float = 3000.0) -> Path:
    """A bundle of an untrained policy carrying ``spec`` (as a trainer exports one), whose
    actions swing across the joint limits as the observation changes."""
    robot = spec_from_dict(spec)
    agent = _loud_agent(ObservationBuilder(robot).dim, len(robot.actions.joints), 1, gain)
    mx.eval(agent.model.parameters())
    bundle = bundle_from_agent(agent, JointCommands(robot).action_config(), "test",
                               robot_payload(robot))
    return save_bundle(folder / f"{spec['name']}_policy", bundle)


class SpecRobot:
    """A robot for a spec policy: publishes ``joint_states`` with joints ``names`` at
    random positions (so the policy's commands change) at 100 Hz, and records the
    Float64MultiArray commands it gets on ``cmd``."""

    def __init__(self, context: rclpy.Context, names: tuple[str, ...]) -> None:
        self.node = rclpy.create_node("spec_robot", context=context)
        self.names = list(names)
        self.rng = np.random.default_rng(5)
        self.pub = self.node.create_publisher(JointState, "joint_states", 10)
        self.commands: list[np.ndarray] = []
        self.node.create_subscription(Float64MultiArray, "cmd",
                                      lambda msg: self.commands.append(np.array(msg.data)), 100)
        self.node.create_timer(0.01, self._publish)

    def _publish(self) -> None:
        msg = JointState(name=self.names)
        msg.header.stamp = self.node.get_clock().now().to_msg()
        msg.position = self.rng.uniform(-1.0, 1.0, len(self.names)).tolist()
        msg.velocity = [0.0] * len(self.names)
        self.pub.publish(msg)
