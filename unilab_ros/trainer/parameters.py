"""The trainer's parameters: declared from the config dataclasses, read into a session's
configs, and the live ones checked and applied in separate callbacks, as ros2/demos'
``set_parameters_callback.py`` does: pre-set refuses names the node does not have, on-set
validates every change, post-set applies the accepted ones."""

from __future__ import annotations

from rcl_interfaces.msg import SetParametersResult
from rclpy.exceptions import ParameterNotDeclaredException
from rclpy.node import Node
from rclpy.parameter import Parameter

from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.loop.watchdog import WatchdogConfig
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.finetune import FineTuneConfig
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.rl.sac_config import SACConfig
from unilab_ros.ros.action_output import ActionOutputConfig
from unilab_ros.ros.params import ConfigError, declare_config, read_config, warn_unknown_parameters
from unilab_ros.trainer.config import TrainerNodeConfig
from unilab_ros.trainer.session import SessionConfig

LIVE_PARAMETERS = frozenset({"training", "deterministic", "ppo.learning_rate"})
"""Parameters that take effect while running; every other one is read-only after start."""


def read_parameters(node: Node) -> tuple[TrainerNodeConfig, SessionConfig, ActionOutputConfig]:
    """Declare every parameter from the config dataclasses and read them back; a bad
    value raises ConfigError with the reason."""
    for config, prefix in (
        (AgentConfig(), ""),
        (ActionConfig(), ""),
        (LoopConfig(), ""),
        (WatchdogConfig(), ""),
        (ActionOutputConfig(), ""),
        (ActionSafetyConfig(), ""),
        (TrainerNodeConfig(), ""),
        (FineTuneConfig(), "finetune"),
        (ModelConfig(), "model"),
        (PPOConfig(), "ppo"),
        (PPORuntimeConfig(), "ppo"),
        (SACConfig(), "sac"),
    ):
        declare_config(node, config, prefix, LIVE_PARAMETERS)
    warn_unknown_parameters(node)
    cfg = read_config(node, TrainerNodeConfig)
    session = SessionConfig(
        agent=read_config(node, AgentConfig),
        loop=read_config(node, LoopConfig),
        watchdog=read_config(node, WatchdogConfig),
        safety=read_config(node, ActionSafetyConfig),
        algorithm=cfg.algorithm,
        robots=cfg.robots,
        resume_from=cfg.resume_from,
        warm_up=cfg.warm_up_update,
        best_min_episodes=cfg.best_min_episodes,
    )
    output = read_config(node, ActionOutputConfig)
    try:
        session.model = read_config(node, ModelConfig, "model")
        session.ppo = read_config(node, PPOConfig, "ppo")
        session.runtime = read_config(node, PPORuntimeConfig, "ppo")
        session.sac = read_config(node, SACConfig, "sac")
        session.sac.validate()
        session.fine_tune = read_config(node, FineTuneConfig, "finetune")
        session.actions = read_config(node, ActionConfig)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return cfg, session, output


class UndeclaredParameters(ParameterNotDeclaredException):
    """A change names parameters the node does not have (rclpy's own message names none)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.names = names

    def __str__(self) -> str:
        return (f"no such parameter: {', '.join(self.names)} (`ros2 param list` shows the "
                "declared ones)")


class LiveParameters:
    """The live parameters of a running loop: ``check_names`` (pre-set) refuses names the
    node does not declare, ``validate`` (on-set) accepts a change only if every value in
    it is valid, ``apply`` (post-set) puts the accepted ones into effect."""

    def __init__(self, node: Node, loop: TrainingLoop, control_services: bool) -> None:
        self._node = node
        self._loop = loop
        self._control = control_services
        node.add_pre_set_parameters_callback(self.check_names)
        node.add_on_set_parameters_callback(self.validate)
        node.add_post_set_parameters_callback(self.apply)

    def check_names(self, params: list[Parameter]) -> list[Parameter]:
        """The change as it is, once every name in it is declared; the parameter service
        answers an undeclared one with this exception's message."""
        undeclared = [param.name for param in params if not self._node.has_parameter(param.name)]
        if undeclared:
            raise UndeclaredParameters(undeclared)
        return params

    def validate(self, params: list[Parameter]) -> SetParametersResult:
        live = [param.name for param in params if param.name in LIVE_PARAMETERS]
        if live and not self._control:
            return SetParametersResult(
                successful=False,
                reason=f"{', '.join(live)}: run-time control is off (control_services: false)",
            )
        for param in params:
            if param.name != "ppo.learning_rate":
                continue
            if not hasattr(self._loop.agent, "ppo_cfg"):
                return SetParametersResult(successful=False,
                                           reason="ppo.learning_rate: this run learns with sac")
            try:
                self._loop.agent.ppo_cfg.check_learning_rate(float(param.value))
            except ValueError as error:
                return SetParametersResult(successful=False, reason=f"ppo.{error}")
        return SetParametersResult(successful=True)

    def apply(self, params: list[Parameter]) -> None:
        loop = self._loop
        for param in params:
            if param.name == "training":
                loop.set_training(bool(param.value))
            elif param.name == "deterministic":
                loop.set_deterministic(bool(param.value))
            elif param.name == "ppo.learning_rate":
                loop.agent.set_learning_rate(float(param.value))
            else:
                continue
            self._node.get_logger().info(f"parameter {param.name} set to {param.value}")
