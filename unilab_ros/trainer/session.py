"""A training session built from configs: the agent and its loop (ROS-free).

The trainer node and the in-process run build their sessions here, so both act, store
and update through the same objects made the same way.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields, replace

import numpy as np

from unilab_ros.loop.action_safety import ActionSafetyConfig
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.training_loop import TrainingLoop
from unilab_ros.loop.watchdog import WatchdogConfig
from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, warm_up_update
from unilab_ros.rl.algorithm import ALGORITHMS, restore
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.checkpoint import Checkpoint
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.finetune import FineTuneConfig, make_agent
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig
from unilab_ros.rl.sac_agent import SACAgent, sac_warm_up
from unilab_ros.rl.sac_checkpoint import load_replay
from unilab_ros.rl.sac_config import SACConfig
from unilab_ros.robot.joint_commands import JointCommands
from unilab_ros.robot.observation import ObservationBuilder
from unilab_ros.robot.spec_types import RobotSpec
from unilab_ros.robot.steps import RobotSteps
from unilab_ros.trainer.spec_parameters import shown_actions

_LOG = logging.getLogger(__name__)


@dataclass
class SessionConfig:
    """Every config a session is made of (the node reads them from its parameters)."""

    agent: AgentConfig
    """Sizes of one robot (``num_envs`` rows); a fleet's agent has robots x as many."""
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    runtime: PPORuntimeConfig = field(default_factory=PPORuntimeConfig)
    actions: ActionConfig = field(default_factory=ActionConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    safety: ActionSafetyConfig = field(default_factory=ActionSafetyConfig)
    fine_tune: FineTuneConfig = field(default_factory=FineTuneConfig)
    robots: list[str] = field(default_factory=list)
    """A fleet's namespaces; empty: one robot."""
    resume_from: str = ""
    """A training checkpoint to continue (iteration, optimizer, normalizer, streams)."""
    warm_up: bool = False
    """Run one throwaway update first, so MLX compiles before the first action."""
    best_min_episodes: int = 100
    """The episode window of the best policy (``BestPolicy``)."""
    robot_spec: RobotSpec | None = None
    """The robot speaks standard messages as this spec says (``with_robot_spec``); each
    robot's step source is then a ``RobotSteps``."""
    algorithm: str = "ppo"
    """The learner: ppo (``model``, ``ppo``) or sac (the off-policy ``sac``)."""
    sac: SACConfig = field(default_factory=SACConfig)


def with_robot_spec(cfg: SessionConfig, spec: RobotSpec) -> tuple[SessionConfig, list[str]]:
    """``cfg`` for a robot of ``spec``: the sizes, the action mapping (in policy units,
    ``JointCommands.action_config``) and the action guard are the spec's. A size given
    otherwise is an error (ValueError); a mapping or guard given otherwise is replaced, with
    one note each."""
    obs_dim, action_dim = ObservationBuilder(spec).dim, len(spec.actions.joints)
    defaults, given = AgentConfig(), cfg.agent
    for name, size in (("obs_dim", obs_dim), ("action_dim", action_dim), ("num_envs", 1)):
        value = getattr(given, name)
        if value not in (getattr(defaults, name), size):
            raise ValueError(f"{name} is {value}, but robot spec {spec.name!r} makes it {size} "
                             "(leave it unset with a robot spec)")
    # The spec's own values, as the node reports them in its parameters, are no news.
    notes = [
        f"{part}.{item.name} given as {getattr(ours, item.name)} is replaced by robot spec "
        f"{spec.name!r}'s (the spec maps actions to joint commands)"
        for part, ours, default, shown in (
            ("actions", cfg.actions, ActionConfig(), shown_actions(spec)),
            ("guard", cfg.safety, ActionSafetyConfig(), spec.actions.guard))
        for item in fields(ours)
        if getattr(ours, item.name) not in (getattr(default, item.name),
                                            getattr(shown, item.name))
    ]
    return replace(cfg, agent=replace(given, obs_dim=obs_dim, action_dim=action_dim, num_envs=1),
                   actions=JointCommands(spec).action_config(), safety=spec.actions.guard,
                   robot_spec=spec), notes


@dataclass
class Session:
    """The loop (with its agent and best policy) and what to tell the operator."""

    loop: TrainingLoop
    notes: list[str]
    """Settings taken from a fine-tuning policy, and the like: one warning each."""
    warm_up_seconds: float | None
    """How long the warm-up update took, when one ran."""


def build_session(cfg: SessionConfig, best: BestPolicy | None = None) -> Session:
    """The agent (fresh, fine-tuned from a policy or resumed) and its loop, which keeps
    the best policy in ``best`` (by default a new one over ``best_min_episodes``).

    Raises ValueError or ``CheckpointError`` with the reason when the configs do not fit
    together or a file cannot be used.
    """
    if cfg.fine_tune.init_from and cfg.resume_from:
        raise ValueError(
            "resume_from continues a training, finetune.init_from starts one from a "
            "policy: give one of them"
        )
    if cfg.algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm '{cfg.algorithm}' unknown; choose one of {ALGORITHMS}")
    if cfg.algorithm == "ppo" and cfg.loop.learner_process:
        raise ValueError("learner_process runs the off-policy learner (algorithm: sac) in a "
                         "process; PPO's update beside acting runs on a thread")
    if cfg.algorithm == "sac" and cfg.fine_tune.init_from:
        raise ValueError("finetune.init_from starts PPO from a policy; the off-policy learner "
                         "starts fresh or resumes (resume_from)")
    for name in ("agent", "model", "ppo", "sac", "runtime", "actions", "loop", "fine_tune"):
        _LOG.debug("%s: %s", name, asdict(getattr(cfg, name)))
    agent_cfg = cfg.agent
    # A robot's messages have num_envs rows; the agent acts for the whole fleet.
    actions = ActionMapper(cfg.actions, agent_cfg.num_envs, agent_cfg.action_dim)
    if cfg.robots:
        agent_cfg = replace(agent_cfg, num_envs=agent_cfg.num_envs * len(cfg.robots))
    # Opened first: a bad path is reported alone, before any warm-up.
    checkpoint = Checkpoint(cfg.resume_from) if cfg.resume_from else None
    warm_up_seconds = None
    if cfg.algorithm == "sac":
        if cfg.warm_up:
            # Before the agent: the warm-up reseeds MLX, and the agent seeds it again.
            warm_up_seconds = sac_warm_up(agent_cfg, cfg.sac)
        agent, notes = SACAgent(agent_cfg, cfg.sac, actions.policy_bounds()), []
    else:
        if cfg.warm_up:
            warm_up_seconds = warm_up_update(agent_cfg, cfg.model, cfg.ppo, cfg.runtime)
        agent, notes = make_agent(
            agent_cfg, cfg.model, cfg.ppo, actions.policy_bounds(), cfg.actions,
            cfg.fine_tune, cfg.runtime,
        )
    stats = EpisodeStats(agent_cfg.num_envs)
    if cfg.algorithm == "sac" and cfg.sac.replay_from:
        if checkpoint is not None:
            raise ValueError("sac.replay_from seeds a new run; a resumed one (resume_from) "
                             "takes its own replay: give one of them")
        count = load_replay(cfg.sac.replay_from, agent)
        notes.append(f"replay seeded with {count} transitions from {cfg.sac.replay_from}")
    if checkpoint is not None:
        restore(agent, checkpoint)
        stats.load_state(checkpoint.extra.get("episodes", {}))
    sources = None
    if cfg.robot_spec is not None:
        # Each robot draws its own episodes' commands, reproducibly from the seed.
        sources = [RobotSteps(cfg.robot_spec, np.random.default_rng([agent_cfg.seed, r]),
                              cfg.loop.step_timeout)
                   for r in range(max(1, len(cfg.robots)))]
    loop = TrainingLoop(
        cfg.loop, agent, actions, cfg.robots, stats,
        best or BestPolicy(cfg.best_min_episodes),
        cfg.watchdog, cfg.safety, sources,
    )
    return Session(loop, notes, warm_up_seconds)
