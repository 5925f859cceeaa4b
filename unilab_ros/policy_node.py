"""policy_node (node ``unilab_policy``): runs a trained policy, inference only.

Subscribes ``observation`` and publishes ``action`` (same contract as the trainer);
sizes, architecture and observation normalizer come from the checkpoint. A watchdog
publishes the safe action when observations stop.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from std_msgs.msg import Float32MultiArray, String
from std_srvs.srv import SetBool

from unilab_ros.action_output import ActionOutput, ActionOutputConfig
from unilab_ros.executors import run_node
from unilab_ros.messages import MessageError, read_matrix
from unilab_ros.params import (
    ConfigError,
    declare_config,
    given_parameters,
    read_config,
    warn_unknown_parameters,
)
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.checkpoint import Checkpoint, CheckpointError, load_policy
from unilab_ros.rl.policy import PolicySampler
from unilab_ros.watchdog import Watchdog, WatchdogConfig

NODE_NAME = "unilab_policy"


@dataclass
class PolicyNodeConfig:
    """Deployment settings."""

    checkpoint: str = ""
    """Training checkpoint or policy export to run (required)."""
    num_envs: int = 1
    """Rows of the observation and action messages."""
    deterministic: bool = True
    """Publish the mean action (else sample from the policy)."""
    qos_depth: int = 10
    """History depth of the topics."""
    observation_limit: float = 1e6
    """Observations with any |value| above this are rejected as bad input."""

    def validate(self) -> None:
        if not self.checkpoint:
            raise ValueError("checkpoint must name a checkpoint file")
        if self.num_envs < 1 or self.qos_depth < 1:
            raise ValueError("num_envs and qos_depth must be positive")
        if not self.observation_limit > 0.0:
            raise ValueError("observation_limit must be positive")


class PolicyNode(Node):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        declare_config(self, PolicyNodeConfig(), live={"deterministic"})
        # A deployed robot reacts to a silence faster than a training run.
        declare_config(self, WatchdogConfig(obs_timeout=0.2))
        declare_config(self, ActionOutputConfig())
        declare_config(self, ActionConfig())
        warn_unknown_parameters(self)
        self.cfg = read_config(self, PolicyNodeConfig)
        self.watchdog = Watchdog(read_config(self, WatchdogConfig))
        output_cfg = read_config(self, ActionOutputConfig)
        try:
            self.model, checkpoint = load_policy(self.cfg.checkpoint)
            self.actions = ActionMapper(
                self._action_settings(checkpoint), self.cfg.num_envs, self.model.action_dim
            )
        except (ValueError, CheckpointError) as error:
            raise ConfigError(str(error)) from None
        self.sampler = PolicySampler(self.model, checkpoint.agent_cfg.seed)
        self.counters = {
            "actions": 0, "rejected_observations": 0, "watchdog_trips": 0, "nonfinite_actions": 0
        }
        qos = QoSProfile(depth=self.cfg.qos_depth)
        self._action_out = ActionOutput(self, output_cfg, qos)
        self._status_pub = self.create_publisher(String, "~/status", qos)
        self.create_subscription(Float32MultiArray, "observation", self._on_observation, qos)
        self.create_service(SetBool, "~/set_deterministic", self._srv_set_deterministic)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(self.watchdog.period, self._watchdog, clock=steady)
        self.create_timer(1.0, self._publish_status, clock=steady)
        self.get_logger().info(
            f"deploying {self.cfg.checkpoint} (iteration {checkpoint.iteration}): "
            f"obs {self.model.obs_dim} -> action {self.model.action_dim}"
        )

    def _action_settings(self, checkpoint: Checkpoint) -> ActionConfig:
        """The training's action mapping from the checkpoint; a parameter given to this
        node overrides its field, and the log shows both values (a scale or limit that
        differs from training changes what the policy does)."""
        given = read_config(self, ActionConfig)
        trained = checkpoint.action_cfg
        if trained is None:
            self.get_logger().warning(
                "the checkpoint does not say how the training mapped actions (written by an "
                "older version): using this node's action_* and safe_action parameters"
            )
            return given
        overridden = given_parameters(self)
        values = {}
        for field in fields(ActionConfig):
            ours, theirs = getattr(given, field.name), getattr(trained, field.name)
            if field.name in overridden and list(ours) != list(theirs):
                self.get_logger().warning(
                    f"{field.name} = {list(ours)} (parameter) overrides {list(theirs)} (the "
                    "training's, from the checkpoint)"
                )
                values[field.name] = ours
            else:
                values[field.name] = theirs
        return ActionConfig(**values)

    def _on_observation(self, msg: Float32MultiArray) -> None:
        try:
            obs = read_matrix(
                msg, self.cfg.num_envs, self.model.obs_dim, limit=self.cfg.observation_limit
            )
        except MessageError as error:
            self.counters["rejected_observations"] += 1
            self.get_logger().warning(
                f"rejected observation: {error.reason}", throttle_duration_sec=5.0
            )
            return
        self.watchdog.observed(time.monotonic())
        actions = self.actions(self.sampler(obs, self.cfg.deterministic))
        if not np.isfinite(actions).all():
            # Whatever the model holds, no NaN or Inf reaches the robot.
            actions = self.actions.safe
            self.counters["nonfinite_actions"] += 1
            self.get_logger().error(
                f"the policy gave a non-finite action ({self.counters['nonfinite_actions']} "
                "so far): the safe action was sent instead",
                throttle_duration_sec=5.0,
            )
        self._action_out.publish(actions)
        self.counters["actions"] += 1

    def _watchdog(self) -> None:
        silence = self.watchdog.check(time.monotonic())
        if silence is None:
            return
        if silence.first:
            self.counters["watchdog_trips"] += 1
            self.get_logger().warning(f"no observation for {self.watchdog.cfg.obs_timeout}s")
        if silence.publish_safe:
            self._action_out.publish(self.actions.safe)

    def _srv_set_deterministic(self, request: SetBool.Request, response: SetBool.Response) -> Any:
        # Through the parameter, so the service and `ros2 param get` always agree.
        result = self.set_parameters([Parameter("deterministic", value=bool(request.data))])[0]
        response.success = result.successful
        response.message = f"deterministic={self.cfg.deterministic}"
        return response

    def _on_set_parameters(self, params: list[Parameter]) -> SetParametersResult:
        for param in params:
            if param.name == "deterministic":
                self.cfg.deterministic = bool(param.value)
                self.get_logger().info(f"parameter deterministic set to {param.value}")
        return SetParametersResult(successful=True)

    def _publish_status(self) -> None:
        state = "watchdog" if self.watchdog.tripped else "deploying"
        self._status_pub.publish(String(data=json.dumps({"state": state, **self.counters})))


def main(args: list[str] | None = None) -> None:
    run_node(NODE_NAME, lambda _ordered: PolicyNode(), args, (ConfigError,))


if __name__ == "__main__":
    main()
