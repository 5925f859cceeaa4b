"""The linear learning-rate schedule: its line and floor, checked settings, the rate each
update steps with, and a resumed run that goes on down the same line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.checkpoint import Checkpoint, restore_agent, save_checkpoint
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

SIZES = AgentConfig(num_envs=2, obs_dim=3, action_dim=1, num_steps=4, seed=1)
LINEAR = {"schedule": "linear", "learning_rate": 1e-3, "schedule_iterations": 4,
          "num_mini_batches": 2, "num_learning_epochs": 2}


def make_agent(**ppo) -> PPOAgent:
    return PPOAgent(SIZES, ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
                    PPOConfig(**(LINEAR | ppo)), runtime_cfg=PPORuntimeConfig())


def rates_of_updates(agent: PPOAgent, updates: int) -> list[tuple[float, float]]:
    """(lowest, highest) rate the mini-batch steps of each update took."""
    rng = np.random.default_rng(agent.iteration)
    rates = []
    for _ in range(updates):
        while not agent.rollout_full:
            obs = rng.normal(size=(SIZES.num_envs, SIZES.obs_dim)).astype(np.float32)
            actions = agent.act(obs)
            agent.record(obs, actions, -np.square(actions).sum(axis=1),
                         np.zeros(SIZES.num_envs, np.uint8))
        metrics = agent.update(obs)
        rates.append((metrics["learning_rate_min"], metrics["learning_rate_max"]))
    return rates


@pytest.mark.parametrize(("fraction", "floor"), [(0.0, 1e-5), (0.1, 1e-4), (0.001, 1e-5)])
def test_the_rate_falls_in_a_line_to_its_floor_and_stays(fraction, floor):
    cfg = PPOConfig(**(LINEAR | {"final_learning_rate_fraction": fraction}))
    rates = [cfg.linear_learning_rate(k) for k in range(7)]
    expected = [1e-3 - (1e-3 - floor) * min(k / 4, 1.0) for k in range(7)]
    assert rates == pytest.approx(expected, rel=1e-12)
    assert rates[0] == 1e-3 and rates[4:] == [floor] * 3


@pytest.mark.parametrize(("fields", "message"), [
    ({"schedule_iterations": 0}, "schedule_iterations must be >= 1 under the linear schedule"),
    ({"final_learning_rate_fraction": 1.5}, "final_learning_rate_fraction must be in"),
    ({"final_learning_rate_fraction": -0.1}, "final_learning_rate_fraction must be in"),
])
def test_bad_linear_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(**(LINEAR | fields)).validate()


def test_schedule_iterations_are_needed_only_by_the_linear_schedule():
    PPOConfig(schedule="fixed").validate()
    with pytest.raises(ValueError, match="schedule_iterations"):
        PPOConfig(schedule="linear").validate()


def test_each_update_steps_with_the_rate_of_its_iteration():
    agent = make_agent()
    cfg = agent.ppo_cfg
    for k, (low, high) in enumerate(rates_of_updates(agent, 6)):
        assert low == high == pytest.approx(cfg.linear_learning_rate(k), rel=1e-6)
    assert agent.trainer.learning_rate == pytest.approx(cfg.min_learning_rate, rel=1e-6)


def test_a_rate_set_while_running_holds_until_the_next_update():
    agent = make_agent()
    rates_of_updates(agent, 1)
    agent.set_learning_rate(5e-3)
    assert agent.trainer.learning_rate == pytest.approx(5e-3)
    ((low, high),) = rates_of_updates(agent, 1)
    assert low == high == pytest.approx(agent.ppo_cfg.linear_learning_rate(1), rel=1e-6)


def test_a_resumed_run_goes_on_down_the_same_line(tmp_path: Path):
    straight = make_agent()
    rates_of_updates(straight, 2)
    path = save_checkpoint(tmp_path / "mid", straight)
    later = rates_of_updates(straight, 3)
    resumed = make_agent()
    restore_agent(resumed, Checkpoint(path))
    assert rates_of_updates(resumed, 3) == later
    assert [low for low, _ in later] == pytest.approx(
        [straight.ppo_cfg.linear_learning_rate(k) for k in (2, 3, 4)], rel=1e-6)
