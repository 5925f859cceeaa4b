"""The algorithm seam: what the training loop, checkpoints, bundles and the trainer ask of a
learner, for PPO (``PPOAgent``) and the off-policy soft actor-critic (``SACAgent``).

Both agents offer the same core: ``cfg`` (an ``AgentConfig``: sizes, and ``num_steps``,
the env steps per env between two learning phases), ``act``, ``update`` (a learning
phase: PPO's epochs on the rollout, SAC's owed gradient steps on replay), ``iteration``,
``env_steps`` and ``model`` (whose parameters the loop checks and restores). What differs
lives here, chosen by the agent's type: where the loop's steps go (PPO's rollout lanes,
SAC's replay), what the acting policy's outputs were, how a training checkpoint and a
policy export are written and read, and the deployable actor.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import PPOAgent
from unilab_ros.rl.background_learner import BackgroundLearner
from unilab_ros.rl.background_update import BackgroundUpdate
from unilab_ros.rl.bundle import PolicyBundle, bundle_from_agent
from unilab_ros.rl.checkpoint import (
    Checkpoint,
    CheckpointError,
    _with_suffix,
    export_policy,
    restore_agent,
    save_checkpoint,
)
from unilab_ros.rl.lanes import LaneRollout
from unilab_ros.rl.learner_process import LearnerProcess, SaveFailed
from unilab_ros.rl.sac_agent import ReplayCollector, SACAgent
from unilab_ros.rl.sac_bundle import bundle_from_sac
from unilab_ros.rl.sac_checkpoint import restore_sac, save_sac_checkpoint

ALGORITHMS = ("ppo", "sac")
Agent = PPOAgent | SACAgent
Collector = LaneRollout | ReplayCollector


def algorithm_of(agent: Agent) -> str:
    return "sac" if isinstance(agent, SACAgent) else "ppo"


def model_lock(agent: Agent) -> contextlib.AbstractContextManager:
    """Held around MLX work on the model from the control thread: a learner thread (the
    off-policy learner's, or PPO's update beside acting) may be computing on it. A learner
    process's state is brought into the agent first (``LearnerProcess.sync``)."""
    if isinstance(agent, SACAgent) and agent.remote is not None:
        agent.remote.sync()
    return agent.model_lock


def learn_beside_acting(agent: Agent, in_process: bool = False, cpu: int = -1
                        ) -> BackgroundLearner | BackgroundUpdate | LearnerProcess:
    """What learns beside acting: the off-policy learner's thread or (``in_process``)
    process (on ``cpu``), started; or PPO's update of each full rollout while the next is
    collected."""
    if isinstance(agent, SACAgent):
        return (LearnerProcess(agent, cpu=cpu) if in_process
                else BackgroundLearner(agent)).start()
    return BackgroundUpdate(agent)


def collector(agent: Agent) -> Collector:
    """Where the training loop puts each step it learns from."""
    return agent.collector() if isinstance(agent, SACAgent) else LaneRollout(agent)


def acted_outputs(agent: Agent, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The acting policy's mean and std of the latest ``act`` (PPO stores them as its "old"
    outputs; replay keeps none, so SAC's are placeholders of the right shapes)."""
    if isinstance(agent, SACAgent):
        return (np.zeros((rows, agent.action_dim), np.float32),
                np.ones(agent.action_dim, np.float32))
    return agent.sampler.last_mean, agent.sampler.last_std


def save_training(path: str | os.PathLike[str], agent: Agent,
                  extra: dict[str, Any] | None = None,
                  actions: ActionConfig | None = None, with_replay: bool = True,
                  failed: SaveFailed | None = None) -> Path:
    """A checkpoint that resumes training (SAC's replay beside it, ``with_replay``). A
    learner process writes it itself, later: a failure then reaches ``failed``."""
    if isinstance(agent, SACAgent) and agent.remote is not None:
        return agent.remote.save(_with_suffix(path), extra, actions, with_replay, failed)
    with model_lock(agent):
        if isinstance(agent, SACAgent):
            return save_sac_checkpoint(path, agent, extra, actions, with_replay)
        return save_checkpoint(path, agent, extra, actions)


def save_policy(path: str | os.PathLike[str], agent: Agent,
                actions: ActionConfig | None = None) -> Path:
    """The deployable actor and configs only."""
    with model_lock(agent):
        if isinstance(agent, SACAgent):
            return save_sac_checkpoint(path, agent, None, actions, with_replay=False,
                                       kind="policy")
        return export_policy(path, agent, actions)


def restore(agent: Agent, checkpoint: Checkpoint) -> None:
    """Continue training ``agent`` from ``checkpoint`` (of the same algorithm)."""
    if checkpoint.algorithm != algorithm_of(agent):
        raise CheckpointError(f"{checkpoint.path} was trained with algorithm "
                              f"{checkpoint.algorithm}; this run is configured for "
                              f"{algorithm_of(agent)}")
    if isinstance(agent, SACAgent):
        restore_sac(agent, checkpoint)
    else:
        restore_agent(agent, checkpoint)


def bundle_of(agent: Agent, actions: ActionConfig, source: str,
              robot: dict[str, Any] | None = None) -> PolicyBundle:
    """The agent's current deterministic policy as a bundle."""
    with model_lock(agent):
        if isinstance(agent, SACAgent):
            return bundle_from_sac(agent, actions, source, robot)
        return bundle_from_agent(agent, actions, source, robot)


def update_summary(metrics: dict[str, float]) -> str:
    """What the learner's update says: PPO's KL and learning rates, or the off-policy
    learner's gradient steps, critic loss and entropy coefficient."""
    if "approx_kl" in metrics:
        # Beside acting: the share of the rollout acted on by the policy before the update.
        lag = f" lag {metrics['policy_lag']:.2f}" if "policy_lag" in metrics else ""
        return (f"kl {metrics['approx_kl']:.4f} (max {metrics['approx_kl_max']:.3f}) "
                f"lr {metrics['learning_rate_min']:.0e}..{metrics['learning_rate_max']:.0e}"
                + lag)
    if not metrics.get("gradient_steps"):
        return "warm-up (random actions, no gradient step yet)"
    return (f"{metrics['gradient_steps']:.0f} gradient steps, critic loss "
            f"{metrics['critic_loss']:.3g}, alpha {metrics['entropy_coef']:.3g}")

