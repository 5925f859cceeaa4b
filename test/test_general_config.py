"""config/continuous_control.yaml, the general starting point, learns a development task
from the file as shipped (Pendulum-v1: its sizes and action bounds are set there).

A random policy scores about -1,200. Bounded (the default, `make test`) seed 0 trains 150k
env steps (bench/learning.py --config measured -257 at 100k, -183 at 200k and a best of
-146 by 300k on seed 0) and must reach -300; the full run (UNILAB_LEARNING=full, `make
test-learning`) trains seeds 0-2 over 300k and must reach -250 on each.

The full run also trains InvertedDoublePendulum-v5 (the bench's copy of the file, only
sizes and budget changed) for 300k on seeds 0-2, the task whose late drop the file's
``normalizer_keeps_outputs`` ended: measured 8,338 / 8,432 / 8,060 at the end against
bests of 8,431 / 8,802 / 8,892 (at a gradient-norm clip of 1.0 9,082 / 8,803 / 8,988
against 9,082 / 9,081 / 8,988; with 128-sample mini-batches 7,874 / 9,083 / 7,781 against
8,150 / 9,083 / 8,522; without the fold 5,736 and 6,111 against 7,958 and 7,561 on seeds 0
and 1). Each seed must pass 7,000 and end within 15% of its best.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.learning

CI = os.environ.get("UNILAB_LEARNING", "bounded").strip().lower() != "full"
SEEDS = (0,) if CI else (0, 1, 2)
ENV_STEPS = 150_000 if CI else 300_000
REACHED = -300.0 if CI else -250.0
RANDOM = -1000.0
IDP_STEPS, IDP_REACHED, IDP_KEPT = 300_000, 7000.0, 0.85
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from general_config import DEV_TASKS, task_files  # noqa: E402  (bench is not a package)


def train_seed(seed: int, params_file: str = "", env_steps: int = ENV_STEPS) -> list[float]:
    """The rolling-mean curve of one seed (run in a child), by default of the file as
    shipped."""
    from unilab_ros.config.paths import config_file
    from unilab_ros.config.training_setup import load_setup
    from unilab_ros.rl.best import BestPolicy
    from unilab_ros.tools.demo import train

    setup = load_setup(Path(params_file or config_file("continuous_control.yaml")))
    setup.agent.seed = seed
    iterations = math.ceil(env_steps / (setup.agent.num_envs * setup.agent.num_steps))
    curve: list[float] = []
    train(setup, iterations, lambda _a, stats, _m: curve.append(stats.mean_return),
          BestPolicy())
    return curve


def test_the_general_file_as_shipped_names_a_development_task_and_its_budget():
    from unilab_ros.config.paths import config_file
    from unilab_ros.config.training_setup import load_setup

    setup = load_setup(config_file("continuous_control.yaml"))
    assert setup.env_id == "Pendulum-v1"
    assert setup.agent.normalize_rewards and setup.ppo.schedule == "linear"
    assert setup.model.normalizer_keeps_outputs
    assert setup.ppo.schedule_iterations == setup.max_iterations


def curve_in_child(*args) -> list[float]:
    # spawn: a forked child would inherit MLX's and OpenBLAS's threads mid-state.
    with ProcessPoolExecutor(max_workers=1,
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        return [value for value in pool.submit(train_seed, *args).result()
                if math.isfinite(value)]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_general_file_learns_pendulum(seed):
    curve = curve_in_child(seed)
    report = ", ".join(f"{value:.0f}" for value in curve[::5])
    assert max(curve) >= REACHED, f"seed {seed} never reached {REACHED}: {report}"
    assert curve[-1] > RANDOM, f"seed {seed} ended no better than random: {report}"


@pytest.mark.skipif(CI, reason="bounded: the run is Pendulum's (above); UNILAB_LEARNING=full")
@pytest.mark.parametrize("seed", (0, 1, 2))
def test_the_general_file_holds_inverted_double_pendulum_to_the_end(seed, tmp_path):
    from unilab_ros.config.paths import config_file

    folder = task_files(config_file("continuous_control.yaml"), tmp_path, {})
    params = folder / DEV_TASKS["inverted_double_pendulum"].params_file
    curve = curve_in_child(seed, str(params), IDP_STEPS)
    report = ", ".join(f"{value:.0f}" for value in curve[::10])
    best = max(curve)
    assert best >= IDP_REACHED, f"seed {seed} never reached {IDP_REACHED}: {report}"
    assert curve[-1] >= IDP_KEPT * best, (
        f"seed {seed} ended at {curve[-1]:.0f}, below {IDP_KEPT} x its best {best:.0f}: {report}"
    )
