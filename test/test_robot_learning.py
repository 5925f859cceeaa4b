"""The cart-pole learns through standard messages only: the MuJoCo robot node free-running
on sim time (joint_states out, effort commands in, a reset service) and the trainer
reading config/robot_specs/cartpole.yaml, as two processes on a graph of their own.

An episode is up to 1,000 control steps at 50 Hz; a random policy lets the pole fall in
about 26. Bounded (the default, `make test`) one seed trains 10 iterations (20k env steps,
about a minute at real_time_factor 8) and must have at least doubled its mean episode
length; the full run (UNILAB_LEARNING=full, `make test-learning`) trains 100 iterations
(200k env steps) and must balance for most of the episode.
Then the best policy, deployed by policy_node on a fresh robot process, must keep the pole
up as long as the training's episodes did.
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import robot_learning  # noqa: E402  (the bench folder is not a package)

pytestmark = [pytest.mark.ros, pytest.mark.learning]

CI = os.environ.get("UNILAB_LEARNING", "bounded").strip().lower() != "full"
ITERATIONS = 10 if CI else 100
REAL_TIME_FACTOR = 8.0


def test_the_cartpole_learns_through_joint_states_and_deploys(tmp_path):
    domain = 1 + (os.getpid() + 37) % 100
    result = robot_learning.train("cartpole", 0, ITERATIONS, REAL_TIME_FACTOR,
                                  tmp_path / "run", domain)
    rows = result["rows"]
    assert len(rows) == ITERATIONS
    lengths = [float(row["mean_length"]) for row in rows]
    if CI:
        assert lengths[-1] >= 2.0 * lengths[0], lengths
    else:
        assert max(lengths) >= 800.0, lengths
    with (tmp_path / "run" / "metrics.csv").open() as f:
        assert float(list(csv.DictReader(f))[-1]["failures"]) > 0
    returns = robot_learning.deploy("cartpole", tmp_path / "run" / "best.safetensors", 3,
                                    REAL_TIME_FACTOR, tmp_path / "run", 1 + (domain + 50) % 100,
                                    timeout=240.0)["returns"]
    assert len(returns) == 3
    # A full episode earns 20 (1 per second); the training's best mean return is the bar,
    # within the spread of its own episodes.
    best = max(float(row["mean_return"]) for row in rows)
    assert sum(returns) / 3 >= 0.5 * best, (returns, best)
