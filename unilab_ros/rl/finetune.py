"""Fine-tuning: a training session that starts from a trained policy (bundle or checkpoint).

The actor, its std and the observation normalizer come from the policy; the critic, the
optimizer, the random streams and the counters start fresh (a bundle carries no critic,
and a robot's rewards need not match the simulator's). Options an on-robot run expects:
freeze the normalizer, override the starting std, train only the critic for the first
updates (the fresh critic's values are noise, and advantages from them would push the
actor anywhere), and anchor the updates to the starting policy (``ppo.anchor_coef``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx.utils import tree_unflatten

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.bundle import PolicyBundle, read_policy
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

ACTOR_FIELDS = (
    "actor_hidden_dims",
    "activation",
    "init_noise_std",
    "noise_std_type",
    "min_std",
    "max_std",
    "normalize_observations",
    "observation_clip",
)
"""Model settings that belong to the actor: a fine-tuned run takes them from the policy."""


@dataclass
class FineTuneConfig:
    """Starting a training session from a trained policy."""

    init_from: str = ""
    """Policy bundle or checkpoint whose actor, std and observation normalizer training
    starts from, with a fresh critic, optimizer and counters; empty: a fresh policy."""
    freeze_normalizer: bool = False
    """Keep the starting observation statistics (else they go on updating, weighted as
    normalizer_prior_count samples)."""
    normalizer_prior_count: float = 0.0
    """Samples the starting observation statistics count as when they go on updating;
    0: the env steps the policy was trained on (from its source)."""
    init_std: float = 0.0
    """Policy std to start from (every dim); 0 keeps the policy's own."""
    critic_warmup_iterations: int = 0
    """First updates that train only the fresh critic: the actor acts as it came."""

    def validate(self) -> None:
        if not self.normalizer_prior_count >= 0.0 or not math.isfinite(
            self.normalizer_prior_count
        ):
            raise ValueError("normalizer_prior_count must be >= 0")
        if not self.init_std >= 0.0 or not math.isfinite(self.init_std):
            raise ValueError("init_std must be >= 0 (0 keeps the policy's std)")
        if self.critic_warmup_iterations < 0:
            raise ValueError("critic_warmup_iterations must be >= 0")


def make_agent(
    cfg: AgentConfig,
    model_cfg: ModelConfig,
    ppo_cfg: PPOConfig,
    action_bounds: tuple[np.ndarray, np.ndarray] | None,
    actions: ActionConfig,
    fine_tune: FineTuneConfig | None = None,
    runtime_cfg: PPORuntimeConfig | None = None,
) -> tuple[PPOAgent, list[str]]:
    """A fresh agent, or one that starts from ``fine_tune.init_from``; notes to log.

    Raises ValueError (``BundleError`` included) with the reason when the policy cannot
    be read or does not fit these sizes.
    """
    fine_tune = fine_tune or FineTuneConfig()
    fine_tune.validate()
    if not fine_tune.init_from:
        if ppo_cfg.anchor_coef > 0.0:
            raise ValueError("ppo.anchor_coef needs init_from: the policy to anchor to")
        if fine_tune.critic_warmup_iterations or fine_tune.freeze_normalizer:
            raise ValueError(
                "critic_warmup_iterations and freeze_normalizer need init_from (fine-tuning)"
            )
        return PPOAgent(cfg, model_cfg, ppo_cfg, action_bounds, runtime_cfg), []
    policy = read_policy(fine_tune.init_from)
    if (policy.obs_dim, policy.action_dim) != (cfg.obs_dim, cfg.action_dim):
        raise ValueError(
            f"{fine_tune.init_from} is a {policy.obs_dim} -> {policy.action_dim} policy; "
            f"the trainer is configured for {cfg.obs_dim} -> {cfg.action_dim}"
        )
    model_cfg, notes = _actor_settings(model_cfg, policy.model_cfg)
    if policy.actions is not None and policy.actions != actions:
        notes.append(
            f"the action mapping {dataclasses.asdict(actions)} differs from the policy's "
            f"training {dataclasses.asdict(policy.actions)}: it will act differently"
        )
    agent = PPOAgent(cfg, model_cfg, ppo_cfg, action_bounds, runtime_cfg)
    start_from(agent, policy, fine_tune)
    return agent, notes


def _actor_settings(given: ModelConfig, trained: ModelConfig) -> tuple[ModelConfig, list[str]]:
    """``given`` with the actor's settings of the policy; a note for each that changes."""
    values = {name: getattr(trained, name) for name in ACTOR_FIELDS}
    notes = [
        f"model.{name} = {values[name]} (the policy's) replaces {getattr(given, name)}"
        for name in ACTOR_FIELDS
        if name != "init_noise_std" and values[name] != getattr(given, name)
    ]
    return dataclasses.replace(given, **values), notes


def start_from(agent: PPOAgent, policy: PolicyBundle, fine_tune: FineTuneConfig) -> None:
    """Put ``policy``'s actor, std and normalizer into ``agent`` (whose model has the
    policy's actor settings) and apply the fine-tuning options."""
    model_cfg = agent.model_cfg
    std = fine_tune.init_std
    if std and not model_cfg.min_std <= std <= model_cfg.max_std:
        raise ValueError(
            f"init_std={std} lies outside the policy's std bounds "
            f"{model_cfg.min_std} .. {model_cfg.max_std}"
        )
    for model in (agent.model, anchor := policy.model()):
        model.update(tree_unflatten(list(policy.arrays.items())), strict=False)
        if std and model_cfg.noise_std_type == "scalar":
            model.std = mx.full((policy.action_dim,), std)
        elif std:
            model.log_std = mx.full((policy.action_dim,), math.log(std))
    prior = fine_tune.normalizer_prior_count or _source_env_steps(policy)
    agent.model.normalizer.count = mx.array(prior, mx.float32)
    mx.eval(agent.model.parameters())
    agent.freeze_normalizer = fine_tune.freeze_normalizer
    agent.critic_only_updates = fine_tune.critic_warmup_iterations
    if agent.ppo_cfg.anchor_coef > 0.0:
        # The anchor is the policy as fine-tuning starts (its std override included), so
        # a raised std for exploration is not pulled straight back.
        agent.trainer.set_anchor(anchor)


def _source_env_steps(policy: PolicyBundle) -> float:
    """The env steps the policy was trained on (its normalizer's weight), from its source."""
    stored = policy.source.get("env_steps", 0)
    try:
        steps = float(stored)
    except (TypeError, ValueError):
        steps = math.nan
    if not math.isfinite(steps) or steps < 0.0:
        raise ValueError(f"the policy's source.env_steps is {stored!r}: it must be a count >= 0")
    return steps
