"""In-process PPO on a Gymnasium task (no ROS): the core's own learning check.

pendulum_demo --iterations 100
pendulum_demo --params-file config/inverted_pendulum.yaml --seed 2

The run reads the same params file as the nodes (config/pendulum.yaml by default), steps
the bridge's own vector env and decides through a session built as the trainer node
builds its own (``trainer.session``), so it learns what ``sim_train`` learns (the same
curve, bit for bit), minus ROS.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from unilab_ros.config.paths import config_file
from unilab_ros.config.training_setup import TrainingSetup, load_setup
from unilab_ros.loop.config import LoopConfig
from unilab_ros.loop.decisions import BeginUpdate, Finished, IterationDone, PublishAction
from unilab_ros.rl.algorithm import Agent, update_summary
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.compute import compute_description
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.finetune import FineTuneConfig
from unilab_ros.sims.gym_vector import GymVectorSim
from unilab_ros.trainer.session import SessionConfig, build_session

IterationCallback = Callable[[Agent, EpisodeStats, dict[str, float]], None]


def train(
    setup: TrainingSetup,
    iterations: int,
    on_iteration: IterationCallback | None = None,
    best: BestPolicy | None = None,
    fine_tune: FineTuneConfig | None = None,
) -> tuple[Agent, EpisodeStats]:
    """Train ``iterations`` rollouts (from ``fine_tune.init_from`` when given); after each
    update, offer the policy to ``best`` and call ``on_iteration``. Env i is seeded with
    ``setup.agent.seed + i``."""
    cfg = setup.agent
    sim = GymVectorSim(setup.env_id, cfg.num_envs, cfg.seed, setup.max_episode_steps)
    session = None
    try:
        # Checkpoints are the caller's (on_iteration); the loop only stops the run. A
        # fine-tuning run starts counting at 0, as a fresh one does.
        session = build_session(SessionConfig(
            cfg, setup.model, setup.ppo, setup.runtime, setup.actions,
            LoopConfig(checkpoint_interval=0, max_iterations=iterations,
                       learn_while_acting=setup.learn_while_acting),
            fine_tune=fine_tune or FineTuneConfig(), algorithm=setup.algorithm, sac=setup.sac,
        ), best)
        loop, agent = session.loop, session.loop.agent
        # One clock for everything: steps never time out, the watchdog never fires, and
        # each step's parts share a stamp that orders it after the action.
        stamp, now = 0, 0.0
        decisions = loop.on_observation(0, sim.reset(), stamp, now, now)
        while agent.iteration < iterations:
            for decision in decisions:
                if isinstance(decision, IterationDone) and on_iteration is not None:
                    on_iteration(agent, loop.stats, decision.metrics)
            if any(isinstance(decision, Finished) for decision in decisions):
                break
            if any(isinstance(decision, BeginUpdate) for decision in decisions):
                metrics = loop.update()
                loop.after_update()
                if on_iteration is not None:
                    on_iteration(agent, loop.stats, metrics)
                decisions = loop.resume(now, now)
                continue
            actions = [d for d in decisions if isinstance(d, PublishAction)]
            if not actions:
                raise RuntimeError(
                    f"step {stamp} was not paired (see the counters: {loop.step_counters})"
                )
            step = sim.step(actions[0].command)
            stamp += 1
            loop.on_reward(0, step.reward, stamp, now)
            loop.on_done(0, step.done, stamp, now)
            decisions = loop.on_observation(0, step.observation, stamp, now, now)
        return agent, loop.stats
    finally:
        if session is not None:
            session.loop.close()
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
    print(f"{setup.env_id}, seed {args.seed}; {compute_description()}", flush=True)
    start = time.perf_counter()
    best = BestPolicy()

    def progress(agent: Agent, stats: EpisodeStats, m: dict[str, float]) -> None:
        rate = agent.env_steps / (time.perf_counter() - start)
        print(
            f"iter {agent.iteration:4d}  steps {agent.env_steps:7d}  "
            f"return {stats.mean_return:8.1f}  best {best.mean_return:8.1f}  "
            f"{update_summary(m)}  {rate:6.0f} steps/s  update {m['update_time']:.2f}s",
            flush=True,
        )

    train(setup, iterations, progress, best)
    print(f"best mean return {best.mean_return:.1f} (iteration {best.iteration})", flush=True)


if __name__ == "__main__":
    main()
