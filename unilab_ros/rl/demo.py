"""In-process PPO on a Gymnasium task (no ROS): the core's own learning check.

pendulum_demo --iterations 100
pendulum_demo --params-file config/inverted_pendulum.yaml --seed 2

The run reads the same params file as the nodes (config/pendulum.yaml by default) and
steps the bridge's own vector env, so it learns what ``sim_train`` learns, minus ROS.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from unilab_ros.gym_vector import GymVectorSim
from unilab_ros.paths import config_file
from unilab_ros.rl.actions import ActionMapper
from unilab_ros.rl.agent import PPOAgent
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.blas import blas_description
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.setup_file import TrainingSetup, load_setup

IterationCallback = Callable[[PPOAgent, EpisodeStats, dict[str, float]], None]


def train(
    setup: TrainingSetup,
    iterations: int,
    on_iteration: IterationCallback | None = None,
    best: BestPolicy | None = None,
) -> tuple[PPOAgent, EpisodeStats]:
    """Train ``iterations`` rollouts; after each update, offer the policy to ``best`` and
    call ``on_iteration``. Env i is seeded with ``setup.agent.seed + i``."""
    cfg = setup.agent
    sim = GymVectorSim(setup.env_id, cfg.num_envs, cfg.seed, setup.max_episode_steps)
    try:
        to_env = ActionMapper(setup.actions, cfg.num_envs, cfg.action_dim)
        agent = PPOAgent(cfg, setup.model, setup.ppo, action_bounds=to_env.policy_bounds())
        stats = EpisodeStats(cfg.num_envs)
        obs = sim.reset()
        for _ in range(iterations):
            while not agent.rollout_full:
                actions = agent.act(obs)
                step = sim.step(to_env(actions))
                agent.record(obs, actions, step.reward, step.done)
                stats.add(step.reward, step.done)
                obs = step.observation
            metrics = agent.update(obs)
            if best is not None:
                best.offer(agent, stats)
            if on_iteration is not None:
                on_iteration(agent, stats, metrics)
        return agent, stats
    finally:
        sim.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params-file", type=Path, default=None)
    parser.add_argument("--iterations", type=int, default=None,
                        help="default: the params file's max_iterations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    setup = load_setup(args.params_file or config_file("pendulum.yaml"))
    setup.agent.seed = args.seed
    iterations = args.iterations or setup.max_iterations or 75
    print(f"{setup.env_id}, seed {args.seed}; BLAS: {blas_description()}", flush=True)
    start = time.perf_counter()
    best = BestPolicy()

    def progress(agent: PPOAgent, stats: EpisodeStats, m: dict[str, float]) -> None:
        rate = agent.env_steps / (time.perf_counter() - start)
        print(
            f"iter {agent.iteration:4d}  steps {agent.env_steps:7d}  "
            f"return {stats.mean_return:8.1f}  best {best.mean_return:8.1f}  "
            f"kl max {m['approx_kl_max']:.4f}  lr {m['learning_rate']:.1e}  "
            f"std {m['std_mean']:.3f}  {rate:6.0f} steps/s  update {m['update_time']:.2f}s",
            flush=True,
        )

    train(setup, iterations, progress, best)
    print(f"best mean return {best.mean_return:.1f} (iteration {best.iteration})", flush=True)


if __name__ == "__main__":
    main()
