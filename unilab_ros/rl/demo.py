"""In-process PPO on a Gymnasium task (no ROS): the core's own learning check.

pendulum_demo --iterations 100
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np

from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.blas import blas_description
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo import PPOConfig


@dataclass
class PendulumSetup:
    """Hyperparameters that solve Pendulum-v1 with this PPO."""

    agent: AgentConfig = field(
        default_factory=lambda: AgentConfig(
            num_envs=16, obs_dim=3, action_dim=1, num_steps=128, reward_scale=0.1
        )
    )
    model: ModelConfig = field(
        default_factory=lambda: ModelConfig(
            actor_hidden_dims=[64, 64], critic_hidden_dims=[64, 64], init_noise_std=1.0
        )
    )
    ppo: PPOConfig = field(
        default_factory=lambda: PPOConfig(
            num_learning_epochs=10,
            num_mini_batches=32,
            gamma=0.95,
            learning_rate=3e-4,
            use_clipped_value_loss=False,
        )
    )
    actions: ActionConfig = field(
        default_factory=lambda: ActionConfig(
            action_scale=[2.0], action_low=[-2.0], action_high=[2.0]
        )
    )


def train(
    env_id: str,
    setup: PendulumSetup,
    iterations: int,
    on_iteration: Callable[[int, PPOAgent, EpisodeStats, dict[str, float]], None] | None = None,
) -> tuple[PPOAgent, EpisodeStats]:
    """Train ``iterations`` rollouts; call ``on_iteration`` after each update."""
    cfg = setup.agent
    envs = gym.make_vec(
        env_id,
        num_envs=cfg.num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    try:
        agent = PPOAgent(cfg, setup.model, setup.ppo)
        to_env = ActionMapper(setup.actions, cfg.num_envs, cfg.action_dim)
        stats = EpisodeStats(cfg.num_envs)
        obs, _ = envs.reset(seed=cfg.seed)
        for _ in range(iterations):
            while not agent.rollout_full:
                actions = agent.act(obs)
                next_obs, rewards, terminated, truncated, _ = envs.step(to_env(actions))
                dones = np.where(terminated, 1, np.where(truncated, 2, 0)).astype(np.uint8)
                agent.record(obs, actions, rewards, dones)
                stats.add(rewards, dones)
                obs = next_obs
            metrics = agent.update(obs)
            if on_iteration is not None:
                on_iteration(agent.iteration, agent, stats, metrics)
        return agent, stats
    finally:
        envs.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="Pendulum-v1")
    parser.add_argument("--iterations", type=int, default=75)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    setup = PendulumSetup()
    setup.agent.seed = args.seed
    print(f"BLAS: {blas_description()}", flush=True)
    start = time.perf_counter()

    def progress(it: int, agent: PPOAgent, stats: EpisodeStats, m: dict[str, float]) -> None:
        rate = agent.env_steps / (time.perf_counter() - start)
        print(
            f"iter {it:4d}  steps {agent.env_steps:7d}  return {stats.mean_return:8.1f}  "
            f"kl {m['approx_kl']:.4f}  lr {m['learning_rate']:.1e}  "
            f"{rate:6.0f} steps/s  update {m['update_time']:.2f}s",
            flush=True,
        )

    train(args.env_id, setup, args.iterations, progress)


if __name__ == "__main__":
    main()
