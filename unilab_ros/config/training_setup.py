"""Training setups read from the package's params files, for in-process (ROS-free) runs.

The shipped YAML files (config/*.yaml) are what the nodes run with through ROS; the
in-process demo, the learning tests and bench/learning.py read the same files, so a
setting tuned once holds for both paths. The files are keyed like ROS params files
(``/**/unilab_trainer: ros__parameters: ...``); this module needs only PyYAML.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from unilab_ros.config.parameter_files import (
    build,
    field_names,
    node_parameters,
    unknown_keys,
    unknown_message,
)
from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.rl.sac_config import SACConfig

TRAINER_KEY = "unilab_trainer"
BRIDGE_KEY = "gym_env"
LOG = logging.getLogger(__name__)


@dataclass
class TrainingSetup:
    """Everything an in-process run needs: the environment and the trainer's configs."""

    env_id: str = "Pendulum-v1"
    """Gymnasium id (the bridge's env_id)."""
    max_episode_steps: int = 0
    """The bridge's time limit; 0 keeps the env's registered one."""
    max_iterations: int = 0
    """The trainer's max_iterations (0: unbounded)."""
    agent: AgentConfig = field(default_factory=AgentConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    runtime: PPORuntimeConfig = field(default_factory=PPORuntimeConfig)
    """How the update runs; its keys share the params file's ``ppo`` section."""
    actions: ActionConfig = field(default_factory=ActionConfig)
    algorithm: str = "ppo"
    """The learner (the trainer's ``algorithm``): ppo or sac."""
    sac: SACConfig = field(default_factory=SACConfig)
    learn_while_acting: bool = False
    """The trainer's ``learn_while_acting``: the learner on a thread beside acting."""


def load_setup(params_file: str | Path) -> TrainingSetup:
    """Read a params file into a ``TrainingSetup`` (dataclass defaults where it is silent)."""
    with open(params_file) as handle:
        document = yaml.safe_load(handle)
    trainer = node_parameters(document, TRAINER_KEY)
    bridge = node_parameters(document, BRIDGE_KEY)
    if not trainer:
        raise ValueError(f"{params_file} has no {TRAINER_KEY} ros__parameters")
    model, ppo = trainer.get("model") or {}, trainer.get("ppo") or {}
    sac = trainer.get("sac") or {}
    # The sections this run reads whole; the trainer node's own top-level keys are the
    # node's to check (it warns at start).
    unknown = [*unknown_keys(model, field_names(ModelConfig), "model"),
               *unknown_keys(ppo, field_names(PPOConfig, PPORuntimeConfig), "ppo"),
               *unknown_keys(sac, field_names(SACConfig), "sac")]
    if unknown:
        LOG.warning(unknown_message(unknown, f"{params_file}: the fields of ModelConfig, "
                                    "PPOConfig, PPORuntimeConfig and SACConfig are the keys"))
    agent = build(AgentConfig, trainer)
    if "seed" in bridge and "seed" not in trainer:
        agent.seed = int(bridge["seed"])
    return TrainingSetup(
        env_id=str(bridge.get("env_id", TrainingSetup.env_id)),
        max_episode_steps=int(bridge.get("max_episode_steps", 0)),
        max_iterations=int(trainer.get("max_iterations", 0)),
        agent=agent,
        model=build(ModelConfig, model),
        ppo=build(PPOConfig, ppo),
        runtime=build(PPORuntimeConfig, ppo),
        actions=build(ActionConfig, trainer),
        algorithm=str(trainer.get("algorithm", "ppo")),
        sac=build(SACConfig, sac),
        learn_while_acting=bool(trainer.get("learn_while_acting", False)),
    )
