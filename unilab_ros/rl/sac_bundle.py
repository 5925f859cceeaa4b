"""The off-policy learner's actor as a policy bundle: what the deploy node, ONNX export and
fine-tuning read, with no part of SAC's training.

A bundle's actor is an ``MLPActorCritic`` actor. SAC's deterministic action is
``low + (tanh(mean) + 1) (high - low) / 2`` in policy units, its mean the first half of the
actor's last layer; so the bundle keeps the hidden layers, the mean half of the last one,
the observation normalizer, and ``squash_output`` with the box's center and half-width as
``squash_center`` / ``squash_scale``. Its std is the model's floor (``min_std``): a bundle
serves the deterministic policy, and a sampled action from it is that action.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from unilab_ros.rl.actions import ActionConfig
from unilab_ros.rl.bundle import PolicyBundle
from unilab_ros.rl.checkpoint import package_versions
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.sac_agent import SACAgent


def sac_model_config(agent: SACAgent) -> ModelConfig:
    """The deployed actor's architecture."""
    cfg = agent.sac_cfg
    return ModelConfig(actor_hidden_dims=list(cfg.actor_hidden_dims),
                       critic_hidden_dims=list(cfg.critic_hidden_dims),
                       activation=cfg.activation, init_noise_std=1e-3, min_std=1e-3,
                       normalize_observations=cfg.normalize_observations,
                       observation_clip=cfg.observation_clip, squash_output=True)


def sac_policy_arrays(agent: SACAgent) -> dict[str, mx.array]:
    """The deployed actor's arrays, named as ``MLPActorCritic`` names them."""
    model = agent.model
    layers = model.actor.layers
    arrays: dict[str, mx.array] = {}
    for index, layer in enumerate(layers):
        weight, bias = layer.weight, layer.bias
        if index == len(layers) - 1:
            weight, bias = weight[: agent.action_dim], bias[: agent.action_dim]
        arrays[f"actor.layers.{index}.weight"] = weight
        arrays[f"actor.layers.{index}.bias"] = bias
    arrays["normalizer.mean"] = model.normalizer.mean
    arrays["normalizer.var"] = model.normalizer.var
    arrays["std"] = mx.full((agent.action_dim,), 1e-3)
    arrays["squash_center"] = mx.array(agent.low + agent.half_range)
    arrays["squash_scale"] = mx.array(agent.half_range)
    return arrays


def bundle_from_sac(agent: SACAgent, actions: ActionConfig, source: str,
                    robot: dict[str, Any] | None = None) -> PolicyBundle:
    """The current deterministic policy of an off-policy session."""
    return PolicyBundle(
        obs_dim=agent.obs_dim, action_dim=agent.action_dim, model_cfg=sac_model_config(agent),
        actions=actions, arrays=sac_policy_arrays(agent), seed=agent.cfg.seed,
        robot=dict(robot or {}),
        source={"file": source, "kind": "training", "algorithm": "sac",
                "iteration": agent.iteration, "env_steps": agent.env_steps,
                "versions": package_versions()},
    )
