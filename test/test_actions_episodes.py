"""ActionMapper (scale, then clip, per dim; the limits in policy units) and EpisodeStats
(returns, lengths, cut)."""

import math

import numpy as np
import pytest

from unilab_ros.rl.actions import ActionConfig, ActionMapper
from unilab_ros.rl.episodes import EpisodeStats


def test_scales_then_clips_per_dim():
    cfg = ActionConfig(
        action_scale=[2.0, 0.5, -1.0],
        action_low=[-1.0, -10.0, 0.0],
        action_high=[1.0, 10.0, 3.0],
        safe_action=[0.0, 0.0, 1.0],
    )
    mapper = ActionMapper(cfg, num_envs=2, action_dim=3)
    policy = np.array([[0.25, 4.0, -2.0], [3.0, -40.0, 1.0]])
    commands = mapper(policy)
    # Row 0: 0.5 inside, 2.0 inside, 2.0 inside; row 1: 6 -> 1, -20 -> -10, -1 -> 0.
    np.testing.assert_array_equal(commands, [[0.5, 2.0, 2.0], [1.0, -10.0, 0.0]])
    assert commands.dtype == np.float32
    np.testing.assert_array_equal(mapper.safe, [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])


def test_single_values_apply_to_every_dim():
    cfg = ActionConfig(action_scale=[2.0], action_low=[-2.0], action_high=[2.0])
    mapper = ActionMapper(cfg, num_envs=1, action_dim=4)
    np.testing.assert_array_equal(mapper(np.array([[-3.0, -0.5, 0.5, 3.0]])), [[-2, -1, 1, 2]])
    np.testing.assert_array_equal(mapper.safe, np.zeros((1, 4)))


def test_policy_bounds_per_dim_with_negative_and_zero_scales():
    cfg = ActionConfig(
        action_scale=[2.0, 0.5, -1.0, 0.0],
        action_low=[-1.0, -10.0, 0.0, 0.0],
        action_high=[1.0, 10.0, 3.0, 3.0],
        safe_action=[0.0, 0.0, 1.0, 0.0],
    )
    mapper = ActionMapper(cfg, num_envs=1, action_dim=4)
    low, high = mapper.policy_bounds()
    # limit / scale; a negative scale swaps the ends; a zero scale leaves the dim unbounded
    # (every policy output maps to 0, so the mean has nothing to be pulled back from; a
    # limit of 0 would make 0 / 0 otherwise).
    np.testing.assert_array_equal(low, [-0.5, -20.0, -3.0, -np.inf])
    np.testing.assert_array_equal(high, [0.5, 20.0, 0.0, np.inf])
    assert low.dtype == high.dtype == np.float32
    # The bounds are where clipping starts: just inside, the command follows the policy.
    bounded = slice(0, 3)
    inside = np.stack([low * 0.999, high * 0.999])[:, bounded]
    np.testing.assert_allclose(mapper(np.pad(inside, ((0, 0), (0, 1))))[:, bounded],
                               inside * cfg.action_scale[:3], rtol=1e-6)
    beyond = np.stack([low - 1.0, high + 1.0])[:, bounded]
    at_bounds = np.stack([low, high])[:, bounded]
    np.testing.assert_array_equal(mapper(np.pad(beyond, ((0, 0), (0, 1))))[:, bounded],
                                  mapper(np.pad(at_bounds, ((0, 0), (0, 1))))[:, bounded])


def test_policy_bounds_of_single_values_cover_every_dim():
    cfg = ActionConfig(action_scale=[2.0], action_low=[-2.0], action_high=[1.0])
    low, high = ActionMapper(cfg, num_envs=3, action_dim=2).policy_bounds()
    np.testing.assert_array_equal(low, [-1.0, -1.0])
    np.testing.assert_array_equal(high, [0.5, 0.5])


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"action_low": [1.0], "action_high": [-1.0]}, id="low-above-high"),
        pytest.param({"action_low": [-1.0, 2.0], "action_high": [1.0, 1.0]}, id="one-dim"),
        pytest.param({"action_scale": [1.0, 2.0, 3.0]}, id="too-many-scales"),
        pytest.param({"action_low": [-1.0, -1.0, -1.0]}, id="too-many-lows"),
        pytest.param({"action_high": [1.0, float("nan")]}, id="nan-per-dim"),
        # A single value is broadcast to every dim, so it must be checked just the same:
        # a NaN limit would turn every command into NaN.
        pytest.param({"action_high": [float("nan")]}, id="nan-single"),
        pytest.param({"action_scale": [float("inf")]}, id="inf-single"),
        pytest.param({"safe_action": [5.0]}, id="safe-outside"),
    ],
)
def test_bad_limits_rejected(fields):
    with pytest.raises(ValueError):
        ActionMapper(ActionConfig(**fields), num_envs=1, action_dim=2)


def test_episode_returns_and_lengths_for_both_done_codes():
    stats = EpisodeStats(num_envs=2)
    # env 0 ends by termination (1) after 2 steps, env 1 by time-out (2) after 3 steps.
    stats.add(np.array([1.0, 10.0]), np.array([0, 0]))
    stats.add(np.array([2.0, 20.0]), np.array([1, 0]))
    stats.add(np.array([4.0, 30.0]), np.array([0, 2]))
    assert list(stats.finished_returns) == [3.0, 60.0]
    assert list(stats.finished_lengths) == [2, 3]
    assert stats.episodes == 2
    # env 0's next episode started fresh after its termination.
    stats.add(np.array([8.0, 1.0]), np.array([2, 0]))
    assert list(stats.finished_returns) == [3.0, 60.0, 12.0]
    assert list(stats.finished_lengths) == [2, 3, 2]
    assert stats.mean_return == pytest.approx(25.0)
    assert stats.mean_length == pytest.approx(7.0 / 3.0)


def test_an_episode_cut_by_lost_steps_is_not_logged_as_a_whole_one():
    stats = EpisodeStats(num_envs=2)
    stats.add(np.array([-5.0, -5.0]), np.array([0, 0]))
    stats.cut()
    # Its return would read -1 instead of -6: a flattering partial one.
    stats.add(np.array([-1.0, -2.0]), np.array([1, 0]))
    assert list(stats.finished_returns) == [] and stats.episodes == 0
    # The next episodes are whole again.
    stats.add(np.array([-3.0, -4.0]), np.array([1, 1]))
    assert list(stats.finished_returns) == [-3.0]
    assert list(stats.finished_lengths) == [1]


def test_window_keeps_the_latest_episodes_and_empty_means_are_nan():
    stats = EpisodeStats(num_envs=1, window=2)
    assert math.isnan(stats.mean_return) and math.isnan(stats.mean_length)
    for reward in (1.0, 2.0, 3.0):
        stats.add(np.array([reward]), np.array([1]))
    assert list(stats.finished_returns) == [2.0, 3.0]
    assert stats.episodes == 3
