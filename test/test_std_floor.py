"""model.min_std as a floor on exploration: a task that rewards a small std drives the
learned std past it, and the policy's std still never goes under it, in acting or in the
update; once there it stays (the clip passes no gradient)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig

NUM_ENVS, OBS_DIM, ACTION_DIM = 8, 3, 2
MIN_STD = 0.6


def train(noise_std_type: str, updates: int) -> tuple[PPOAgent, list[float], list[float]]:
    """Reward -|a|^2 (best with no noise at all); the acting stds and the updates' std_mean."""
    agent = PPOAgent(
        AgentConfig(num_envs=NUM_ENVS, obs_dim=OBS_DIM, action_dim=ACTION_DIM, num_steps=16),
        ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16], init_noise_std=0.8,
                    min_std=MIN_STD, noise_std_type=noise_std_type),
        PPOConfig(learning_rate=1e-2, entropy_coef=0.0),
    )
    rng = np.random.default_rng(0)
    acting, updated = [], []
    for _ in range(updates):
        while not agent.rollout_full:
            obs = rng.normal(size=(NUM_ENVS, OBS_DIM)).astype(np.float32)
            actions = agent.act(obs)
            acting.append(float(agent.sampler.last_std.min()))
            agent.record(obs, actions, -np.square(actions).sum(axis=1),
                         np.zeros(NUM_ENVS, np.uint8))
        updated.append(agent.update(obs)["std_mean"])
    return agent, acting, updated


@pytest.mark.parametrize(("noise_std_type", "slack"), [("scalar", 0.0), ("log", 1e-6)])
def test_the_std_never_goes_under_min_std_and_stays_at_it(noise_std_type, slack):
    agent, acting, updated = train(noise_std_type, updates=8)
    floor = np.float32(MIN_STD) * (1.0 - slack)  # log: exp(log(min_std)) may be an ulp under
    assert min(acting) >= floor and min(updated) >= floor
    # The learned parameter went past the floor: the clip is what held the std.
    if noise_std_type == "scalar":
        assert float(agent.model.std.max()) < MIN_STD
    else:
        assert float(agent.model.log_std.max()) < math.log(MIN_STD)
    assert acting[-1] == pytest.approx(MIN_STD, rel=1e-6)
    assert updated[-3:] == pytest.approx([MIN_STD] * 3, rel=1e-6)
