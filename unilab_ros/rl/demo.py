"""In-process PPO on a Gymnasium task (no ROS): the core's own learning check.

pendulum_demo --iterations 100
pendulum_demo --params-file config/inverted_pendulum.yaml --seed 2

The run reads the same params file as the nodes (config/pendulum.yaml by default), steps
the bridge's own vector env and decides through the trainer node's own ``TrainingLoop``,
so it learns what ``sim_train`` learns (the same curve, bit for bit), minus ROS.
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
from unilab_ros.rl.finetune import FineTuneConfig, make_agent
from unilab_ros.rl.setup_file import TrainingSetup, load_setup
from unilab_ros.training_loop import BeginUpdate, LoopConfig, PublishAction, TrainingLoop

IterationCallback = Callable[[PPOAgent, EpisodeStats, dict[str, float]], None]


def train(
    setup: TrainingSetup,
    iterations: int,
    on_iteration: IterationCallback | None = None,
    best: BestPolicy | None = None,
    fine_tune: FineTuneConfig | None = None,
) -> tuple[PPOAgent, EpisodeStats]:
    """Train ``iterations`` rollouts (from ``fine_tune.init_from`` when given); after each
    update, offer the policy to ``best`` and call ``on_iteration``. Env i is seeded with
    ``setup.agent.seed + i``."""
    cfg = setup.agent
    sim = GymVectorSim(setup.env_id, cfg.num_envs, cfg.seed, setup.max_episode_steps)
    try:
        to_env = ActionMapper(setup.actions, cfg.num_envs, cfg.action_dim)
        agent, _ = make_agent(
            cfg, setup.model, setup.ppo, to_env.policy_bounds(), setup.actions, fine_tune,
            setup.runtime,
        )
        # Checkpoints are the caller's (on_iteration); the loop only stops the run.
        loop_cfg = LoopConfig(
            checkpoint_interval=0, max_iterations=agent.iteration + iterations
        )
        loop = TrainingLoop(loop_cfg, agent, to_env, best=best)
        # One clock for everything: steps never time out, the watchdog never fires, and
        # each step's parts share a stamp that orders it after the action.
        stamp, now = 0, 0.0
        decision = loop.on_observation(sim.reset(), stamp, now, now)
        while agent.iteration < loop_cfg.max_iterations:
            if isinstance(decision, BeginUpdate):
                metrics = loop.update()
                loop.after_update()
                if on_iteration is not None:
                    on_iteration(agent, loop.stats, metrics)
                decision = loop.resume(now, now)
                continue
            if not isinstance(decision, PublishAction):
                raise RuntimeError(
                    f"step {stamp} was not paired (see the counters: {loop.sync.counters})"
                )
            step = sim.step(decision.command)
            stamp += 1
            loop.on_reward(step.reward, stamp, now)
            loop.on_done(step.done, stamp, now)
            decision = loop.on_observation(step.observation, stamp, now, now)
        return agent, loop.stats
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
