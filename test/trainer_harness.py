"""The trainer tests' harness: a TrainerNode with real rclpy beside a fake environment node
whose publishers a test drives one message at a time, spun by one executor.

Sizes are tiny (2 envs x obs 3 -> action 1, 4-step rollouts) so an update takes
milliseconds. conftest.py's ``make_env`` fixture builds these and closes them after a test.
"""

from pathlib import Path

import numpy as np
import rcl_interfaces.msg
import rclpy
from rcl_interfaces.srv import GetParameters, SetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from ros_helpers import spin_until
from std_msgs.msg import Float32MultiArray, Float64MultiArray, UInt8MultiArray

from unilab_ros.ros.messages import read_matrix, to_float32_msg, to_uint8_msg
from unilab_ros.trainer.node import TrainerNode

PACKAGE_ROOT = Path(__file__).resolve().parents[1]
NUM_ENVS, OBS_DIM, ACTION_DIM, NUM_STEPS = 2, 3, 1, 4
SAFE = 0.25
"""The safe action: distinct from 0 so the test can tell it from a policy action."""
WAIT_S = 5.0
PARTS = ("reward", "done", "obs")


def small_params(**overrides) -> dict:
    params = {
        "num_envs": NUM_ENVS,
        "obs_dim": OBS_DIM,
        "action_dim": ACTION_DIM,
        "num_steps": NUM_STEPS,
        "safe_action": [SAFE],
        "tensorboard": False,
        # Long timeouts by default: only the tests about them shorten them.
        "step_timeout": 10.0,
        "obs_timeout": 10.0,
        "model.actor_hidden_dims": [8],
        "model.critic_hidden_dims": [8],
        "ppo.num_mini_batches": 1,
        "ppo.num_learning_epochs": 2,
    }
    params.update(overrides)
    return params


class FakeEnv:
    """A trainer plus a hand-driven environment node, spun by one executor."""

    def __init__(self, context: rclpy.Context, **overrides) -> None:
        params = small_params(**overrides)
        self.trainer = TrainerNode(
            context=context,
            parameter_overrides=[Parameter(name, value=value) for name, value in params.items()],
        )
        self.node = rclpy.create_node("fake_env", context=context)
        self.obs_pub = self.node.create_publisher(Float32MultiArray, "observation", 100)
        self.reward_pub = self.node.create_publisher(Float32MultiArray, "reward", 100)
        self.done_pub = self.node.create_publisher(UInt8MultiArray, "done", 100)
        action_type = (
            Float64MultiArray if params.get("action_msg_type") == "float64" else Float32MultiArray
        )
        self.action_msgs: list = []
        self.action_sub = self.node.create_subscription(
            action_type, "action", self.action_msgs.append, 100
        )
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.trainer)
        self.executor.add_node(self.node)
        self.rng = np.random.default_rng(0)
        self.closed = False
        assert self.spin_until(
            lambda: all(
                pub.get_subscription_count() > 0
                for pub in (self.obs_pub, self.reward_pub, self.done_pub)
            )
            and self.action_sub.get_publisher_count() > 0
        ), "the trainer and the fake env did not discover each other"

    # Spinning.

    def spin_until(self, predicate, timeout: float = WAIT_S) -> bool:
        return spin_until(self.executor, predicate, timeout)

    def spin_for(self, seconds: float) -> None:
        self.spin_until(lambda: False, timeout=seconds)

    # Messages.

    @property
    def actions(self) -> list[np.ndarray]:
        return [read_matrix(msg, NUM_ENVS, ACTION_DIM) for msg in self.action_msgs]

    def new_obs(self) -> np.ndarray:
        return self.rng.normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32)

    def publish(self, part: str, value) -> None:
        if part == "reward":
            self.reward_pub.publish(to_float32_msg(np.asarray(value, np.float32), ("env",)))
        elif part == "done":
            self.done_pub.publish(to_uint8_msg(np.asarray(value, np.uint8), ("env",)))
        else:
            self.obs_pub.publish(to_float32_msg(np.asarray(value, np.float32), ("env", "obs")))

    def part_received(self, part: str) -> bool:
        # White-box on purpose: waiting for the synchroniser to hold each part is what makes
        # the arrival order the one the test asks for (DDS would otherwise reorder topics).
        pending = self.trainer.loop.robots[0].source._pending
        field = {"reward": "reward", "done": "done", "obs": "next_obs"}[part]
        return pending is not None and getattr(pending, field) is not None

    def start(self, obs: np.ndarray | None = None) -> np.ndarray:
        """Publish the first observation; returns the action that answers it."""
        obs = self.new_obs() if obs is None else obs
        count = len(self.action_msgs)
        self.publish("obs", obs)
        assert self.spin_until(lambda: len(self.action_msgs) > count), "no first action"
        return self.actions[-1]

    def step(
        self,
        reward=None,
        done=None,
        next_obs=None,
        order=PARTS,
        expected_actions: int = 1,
    ) -> np.ndarray:
        """Publish one step's three parts in ``order``; returns the newest action."""
        values = {
            "reward": self.rng.normal(size=NUM_ENVS) if reward is None else reward,
            "done": np.zeros(NUM_ENVS, np.uint8) if done is None else done,
            "obs": self.new_obs() if next_obs is None else next_obs,
        }
        count = len(self.action_msgs)
        for part in order[:-1]:
            self.publish(part, values[part])
            assert self.spin_until(lambda p=part: self.part_received(p)), f"{part} lost"
        self.publish(order[-1], values[order[-1]])
        assert self.spin_until(lambda: len(self.action_msgs) >= count + expected_actions), (
            f"expected {expected_actions} new action(s) after the step"
        )
        return self.actions[-1]

    def call(self, srv_type, name: str, request):
        client = self.node.create_client(srv_type, f"/unilab_trainer/{name}")
        try:
            assert self.spin_until(client.service_is_ready), f"no service {name}"
            future = client.call_async(request)
            assert self.spin_until(future.done), f"{name} did not answer"
            return future.result()
        finally:
            self.node.destroy_client(client)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.executor.shutdown()
        self.trainer.close()
        self.trainer.destroy_node()
        self.node.destroy_node()


def is_safe(action: np.ndarray) -> bool:
    return bool(np.all(action == np.float32(SAFE)))


def set_remote(env: FakeEnv, **values):
    """``ros2 param set``: through the node's SetParameters service."""
    request = SetParameters.Request(
        parameters=[Parameter(name, value=value).to_parameter_msg()
                    for name, value in values.items()])
    return env.call(SetParameters, "set_parameters", request).results


def get_remote(env: FakeEnv, name: str):
    response = env.call(GetParameters, "get_parameters", GetParameters.Request(names=[name]))
    return Parameter.from_parameter_msg(
        rcl_interfaces.msg.Parameter(name=name, value=response.values[0])).value

