"""A sensor glitch against the observation normalizer: Pendulum with and without a spike.

    python bench/normalizer_spike.py                    # seeds 0-2, 150k env steps
    python bench/normalizer_spike.py --seeds 0 --steps 60000

Trains in-process Pendulum (demo.train, the trainer node's own loop, on
config/pendulum.yaml) once clean and once for each spike: for ``--spike-steps`` steps
from env step ``--spike-at`` every observation element of every env reads the spike
value (1e4 and 1e6, below ``observation_limit``, so the trainer takes them), as a robot's
glitching sensor would (times 1 + 1e-3 x the step, so no two steps read the same: the
loop takes a repeated observation for a re-publication). Prints, per seed and run, the
final rolling mean return (last 100 episodes, as the trainer logs it) and the
normalizer's variance after the run. Before
the outlier clipping in rl/normalizer.py a 1e4 spike left the variance at ~1e4 and the
final mean return at -1,186 against -188 clean (issue 17).
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results_page import cpu_model  # noqa: E402  (bench is not a package)

import unilab_ros.rl  # noqa: E402,F401 - loads the optimized BLAS before mlx
from unilab_ros.config.paths import config_file  # noqa: E402
from unilab_ros.config.training_setup import load_setup  # noqa: E402
from unilab_ros.sims import gym_vector  # noqa: E402
from unilab_ros.tools import demo  # noqa: E402


def spiking_sim(value: float, first_step: int, steps: int) -> type[gym_vector.GymVectorSim]:
    """The bridge's vector env, whose observations read ``value`` for ``steps`` steps from
    step ``first_step`` (counted in vector steps; the env itself runs on untouched)."""

    class SpikingSim(gym_vector.GymVectorSim):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._vector_steps = 0

        def step(self, command: np.ndarray) -> gym_vector.VectorStep:
            result = super().step(command)
            self._vector_steps += 1
            if first_step <= self._vector_steps < first_step + steps:
                # A little different each step: the loop takes an observation equal to
                # the previous one for a re-publication, not a new step.
                reading = value * (1.0 + 1e-3 * self._vector_steps)
                glitch = np.full_like(result.observation, reading)
                return gym_vector.VectorStep(glitch, result.reward, result.done)
            return result

    return SpikingSim


def run(seed: int, env_steps: int, spike: float | None, spike_at: int,
        spike_steps: int) -> tuple[float, np.ndarray, float]:
    """(final rolling mean return, normalizer variance, seconds) of one training run."""
    setup = load_setup(config_file("pendulum.yaml"))
    setup.agent.seed = seed
    per_iteration = setup.agent.num_envs * setup.agent.num_steps
    sim = gym_vector.GymVectorSim
    if spike is not None:
        sim = spiking_sim(spike, spike_at // setup.agent.num_envs, spike_steps)
    # demo.train builds its env by this name: the glitch goes in there, nothing else moves.
    demo.GymVectorSim = sim
    start = time.perf_counter()
    try:
        agent, stats = demo.train(setup, math.ceil(env_steps / per_iteration))
    finally:
        demo.GymVectorSim = gym_vector.GymVectorSim
    return stats.mean_return, np.array(agent.model.normalizer.var), time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=150_000, help="env steps per run")
    parser.add_argument("--spikes", type=float, nargs="*", default=[1e4, 1e6],
                        help="observation values of the glitch")
    parser.add_argument("--spike-at", type=int, default=30_000,
                        help="env step the glitch starts at (all envs)")
    parser.add_argument("--spike-steps", type=int, default=5, help="steps the glitch lasts")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_model()} ({platform.machine()}), Python {platform.python_version()}; "
          f"Pendulum-v1, {args.steps} env steps, a {args.spike_steps}-step spike at env "
          f"step {args.spike_at}", flush=True)
    print(f"{'seed':>4}  {'observations':<14}{'final mean return':>18}  "
          f"{'normalizer variance':<36}{'time':>7}", flush=True)
    finals: dict[str, list[float]] = {}
    for seed in args.seeds:
        for spike in (None, *args.spikes):
            label = "clean" if spike is None else f"spike {spike:g}"
            final, var, seconds = run(seed, args.steps, spike, args.spike_at, args.spike_steps)
            finals.setdefault(label, []).append(final)
            variance = " ".join(f"{v:.3g}" for v in var)
            print(f"{seed:>4}  {label:<14}{final:>18.1f}  {variance:<36}{seconds:>6.0f}s",
                  flush=True)
    print("mean over seeds: " + ", ".join(
        f"{label} {np.mean(values):.1f}" for label, values in finals.items()), flush=True)


if __name__ == "__main__":
    main()
