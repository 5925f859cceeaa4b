"""BestPolicy: the best mean return over the last min_episodes finished episodes, kept."""

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.best import BestPolicy
from unilab_ros.rl.episodes import EpisodeStats
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

SIZES = AgentConfig(num_envs=2, obs_dim=3, action_dim=1, num_steps=4, seed=0)


def make_agent() -> PPOAgent:
    return PPOAgent(
        SIZES,
        ModelConfig(actor_hidden_dims=[8], critic_hidden_dims=[8]),
        PPOConfig(num_learning_epochs=2, num_mini_batches=2, learning_rate=1e-2),
        runtime_cfg=PPORuntimeConfig(enable_compile=False),
    )


def train_once(agent: PPOAgent, seed: int) -> None:
    """One rollout of synthetic steps and its update."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(SIZES.num_envs, SIZES.obs_dim)).astype(np.float32)
    while not agent.rollout_full:
        actions = agent.act(obs)
        agent.record(obs, actions, -np.square(actions).sum(axis=1),
                     np.zeros(SIZES.num_envs, np.uint8))
        obs = rng.normal(size=obs.shape).astype(np.float32)
    agent.update(obs)


def finish(stats: EpisodeStats, returns: list[float]) -> None:
    """End one single-step episode per return (stats of one env)."""
    for value in returns:
        stats.add(np.array([value]), np.array([1]))


def host_arrays(tree) -> dict[str, np.ndarray]:
    return {name: np.array(value) for name, value in tree_flatten(tree)}


def test_no_best_before_min_episodes_then_the_first_full_window():
    agent, stats = make_agent(), EpisodeStats(num_envs=1)
    best = BestPolicy(min_episodes=3)
    assert not best.offer(agent, stats)
    finish(stats, [-10.0, -20.0])
    assert not best.offer(agent, stats)
    assert best.parameters is None and best.mean_return == -math.inf
    train_once(agent, seed=0)
    finish(stats, [-30.0])
    assert best.offer(agent, stats)
    assert best.mean_return == pytest.approx(-20.0)
    assert (best.iteration, best.env_steps) == (agent.iteration, agent.env_steps) == (1, 8)


def test_only_a_higher_mean_over_the_last_min_episodes_is_a_new_best():
    agent, stats = make_agent(), EpisodeStats(num_envs=1)
    best = BestPolicy(min_episodes=3)
    finish(stats, [-10.0, -20.0, -30.0])
    assert best.offer(agent, stats)
    finish(stats, [-60.0])  # last three: -36.7
    assert not best.offer(agent, stats)
    finish(stats, [0.0, 0.0])  # last three: -20, as good as the best, not better
    assert not best.offer(agent, stats)
    assert best.mean_return == pytest.approx(-20.0)
    finish(stats, [0.0])  # last three: 0 (all seven: -17.1)
    assert best.offer(agent, stats)
    assert best.mean_return == pytest.approx(0.0)


def test_a_window_with_a_non_finite_return_is_never_best():
    agent, stats = make_agent(), EpisodeStats(num_envs=1)
    best = BestPolicy(min_episodes=2)
    finish(stats, [-5.0, math.nan])
    assert not best.offer(agent, stats)
    assert best.parameters is None


def test_the_arrays_of_the_best_moment_are_kept_while_training_goes_on():
    agent, stats = make_agent(), EpisodeStats(num_envs=1)
    train_once(agent, seed=1)
    best = BestPolicy(min_episodes=1)
    finish(stats, [-1.0])
    assert best.offer(agent, stats)
    at_best = host_arrays(agent.model.parameters())
    obs = mx.array(np.random.default_rng(5).normal(size=(4, SIZES.obs_dim)), mx.float32)
    policy_at_best = np.array(agent.model.policy(obs))

    for seed in (2, 3):
        train_once(agent, seed)
    finish(stats, [-2.0])
    assert not best.offer(agent, stats)
    now = host_arrays(agent.model.parameters())
    kept = host_arrays(best.parameters)
    assert kept.keys() == at_best.keys()
    for name, value in at_best.items():
        np.testing.assert_array_equal(kept[name], value, err_msg=name)
    # Training moved the weights and the normalizer since.
    assert not np.array_equal(now["actor.layers.0.weight"], kept["actor.layers.0.weight"])
    assert not np.array_equal(now["normalizer.mean"], kept["normalizer.mean"])
    assert best.iteration == 1 and agent.iteration == 3

    # The kept arrays are a whole policy: loaded back, it acts as it did then.
    agent.model.update(best.parameters)
    np.testing.assert_array_equal(np.array(agent.model.policy(obs)), policy_at_best)


def test_min_episodes_must_be_positive():
    with pytest.raises(ValueError):
        BestPolicy(min_episodes=0)


def test_a_stored_best_is_replaced_only_by_a_better_policy():
    """A restart into a run folder compared against nothing: its first best (worse than
    the stored one) overwrote best.safetensors."""
    agent = make_agent()
    stats = EpisodeStats(1)
    best = BestPolicy(min_episodes=1)
    best.keep_stored(-0.28, iteration=3)
    finish(stats, [-0.64])
    assert not best.offer(agent, stats) and best.mean_return == -0.28 and best.iteration == 3
    finish(stats, [-0.1])
    assert best.offer(agent, stats) and best.mean_return == pytest.approx(-0.1)
    unset = BestPolicy(min_episodes=1)
    unset.keep_stored(float("nan"), iteration=3)
    assert unset.mean_return == -math.inf
