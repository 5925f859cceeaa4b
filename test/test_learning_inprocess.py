"""PPO learns Pendulum-v1 in-process (no ROS) on several seeds, and holds what it learned.

One seed proves little: floating-point rounding differs between CPUs, and a seed that
solves on one machine can collapse on another. So several seeds train the shipped
config/pendulum.yaml, two at a time in child processes, and each must

- reach the solved region (rolling mean of 100 episodes above SOLVED) within the budget,
- never fall far below it again (WORST_AFTER_SOLVED): the collapse this test exists for
  took the rolling mean from -140 to below -450,
- end close to its kept best policy (MAX_DROP_FROM_BEST).

bench/learning.py measured seeds 0-9 at -192..-172 at 100k env steps and never below
-228 afterwards through 500k. A random policy scores about -1250. Bounded (the default,
`make test`) three seeds train 120k env steps each (~1 min on 2 cores); the full run
(UNILAB_LEARNING=full, `make test-learning`) trains five seeds over 250k.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

CI = os.environ.get("UNILAB_LEARNING", "bounded").strip().lower() != "full"
SEEDS = (0, 1, 2) if CI else (0, 1, 2, 3, 4)
ENV_STEPS = 120_000 if CI else 250_000
SOLVED = -250.0
WORST_AFTER_SOLVED = -350.0
MAX_DROP_FROM_BEST = 100.0

pytestmark = pytest.mark.learning


def train_seed(seed: int) -> dict:
    """Train one seed; the rolling-mean curve and the kept best (run in a child)."""
    from unilab_ros.config.paths import config_file
    from unilab_ros.config.training_setup import load_setup
    from unilab_ros.rl.best import BestPolicy
    from unilab_ros.tools.demo import train

    setup = load_setup(config_file("pendulum.yaml"))
    setup.agent.seed = seed
    iterations = math.ceil(ENV_STEPS / (setup.agent.num_envs * setup.agent.num_steps))
    curve: list[float] = []
    best = BestPolicy()
    train(setup, iterations, lambda _a, stats, _m: curve.append(stats.mean_return), best)
    return {"curve": curve, "best": best.mean_return, "best_iteration": best.iteration}


@pytest.fixture(scope="module")
def runs() -> dict[int, dict]:
    # spawn: a forked child would inherit MLX's and OpenBLAS's threads mid-state.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=context) as pool:
        return dict(zip(SEEDS, pool.map(train_seed, SEEDS), strict=True))


@pytest.mark.parametrize("seed", SEEDS)
def test_pendulum_seed_learns_and_does_not_collapse(runs, seed):
    run = runs[seed]
    curve = [value for value in run["curve"] if math.isfinite(value)]
    report = f"seed {seed}: best {run['best']:.1f}; curve " + ", ".join(
        f"{value:.0f}" for value in curve[::4]
    )
    solved_at = next((i for i, value in enumerate(curve) if value > SOLVED), None)
    assert solved_at is not None, f"never solved; {report}"
    assert min(curve[solved_at:]) > WORST_AFTER_SOLVED, f"collapsed after solving; {report}"
    assert curve[-1] > run["best"] - MAX_DROP_FROM_BEST, f"ended far below its best; {report}"
    # The final window has 100 episodes, so the kept best can only be at least as good.
    assert run["best"] >= curve[-1], report
