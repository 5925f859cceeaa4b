"""The soft actor-critic's math and bookkeeping: the squashed log-density, the critics'
target, Polyak targets, the entropy coefficient's direction, roll-back of a non-finite
step, actions inside the bounds, and the update-to-data ratio."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from unilab_ros.rl.agent import AgentConfig
from unilab_ros.rl.sac import SACLearner, SACModel
from unilab_ros.rl.sac_agent import SACAgent
from unilab_ros.rl.sac_config import SACConfig

SMALL = SACConfig(actor_hidden_dims=[16], critic_hidden_dims=[16], batch_size=8,
                  buffer_size=64, learning_starts=0)


def flat(tree) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in tree_flatten(tree)}


def batch(rows: int = 8, obs_dim: int = 3, action_dim: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (mx.array(rng.standard_normal((rows, obs_dim), dtype=np.float32)),
            mx.array(rng.uniform(-1, 1, (rows, action_dim)).astype(np.float32)),
            mx.array(rng.standard_normal(rows, dtype=np.float32)),
            mx.array(rng.standard_normal((rows, obs_dim), dtype=np.float32)),
            mx.array((rng.random(rows) < 0.3).astype(np.float32)))


def test_the_squashed_log_density_carries_the_change_of_variables():
    mx.random.seed(3)
    model = SACModel(3, 2, SMALL)
    obs = mx.random.normal((64, 3))
    mx.random.seed(7)
    actions, log_prob = model.actor.sample(obs)
    mx.random.seed(7)
    mean, log_std = model.actor(obs)
    noise = mx.random.normal(mean.shape)
    pre = np.array(mean + mx.exp(log_std) * noise, np.float64)
    mean, log_std = np.array(mean, np.float64), np.array(log_std, np.float64)
    gaussian = np.sum(-0.5 * ((pre - mean) / np.exp(log_std)) ** 2 - log_std
                      - 0.5 * math.log(2 * math.pi), axis=-1)
    expected = gaussian - np.sum(np.log(1.0 - np.tanh(pre) ** 2), axis=-1)
    np.testing.assert_allclose(np.array(log_prob), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.array(actions), np.tanh(pre), atol=1e-6)


def test_a_step_moves_the_targets_by_tau_toward_the_updated_critics():
    cfg = SACConfig(**{**SMALL.__dict__, "tau": 0.25})
    mx.random.seed(0)
    model = SACModel(3, 2, cfg)
    learner = SACLearner(model, seed=1)
    targets_before = flat(model.targets.parameters())
    mx.eval(learner.step(*batch()), *learner.arrays())
    critics, targets = flat(model.critics.parameters()), flat(model.targets.parameters())
    assert any(not np.allclose(critics[k], targets_before[k]) for k in critics)
    for name, before in targets_before.items():
        np.testing.assert_allclose(targets[name], 0.75 * before + 0.25 * critics[name],
                                   rtol=1e-5, atol=1e-6)


def test_the_critics_regress_on_the_soft_bellman_target_without_bootstrap_at_failures():
    cfg = SACConfig(**{**SMALL.__dict__, "gamma": 0.9})
    mx.random.seed(0)
    model = SACModel(3, 2, cfg)
    learner = SACLearner(model, seed=1)
    obs, actions, rewards, next_obs, terminal = batch()
    alpha = float(np.exp(np.array(model.log_alpha))[0])
    q_before = np.array(model.critics(model.normalize(obs), actions))
    mx.random.seed(5)
    next_actions, next_log_prob = model.actor.sample(model.normalize(next_obs))
    next_q = np.min(np.array(model.targets(model.normalize(next_obs), next_actions)), axis=0)
    target = np.array(rewards) + 0.9 * (1 - np.array(terminal)) * (
        next_q - alpha * np.array(next_log_prob))
    expected_loss = 0.5 * np.sum(np.mean((q_before - target) ** 2, axis=-1))
    mx.random.seed(5)  # the step draws the same next actions
    metrics = learner.step(obs, actions, rewards, next_obs, terminal)
    mx.eval(metrics)
    np.testing.assert_allclose(float(metrics[0]), expected_loss, rtol=1e-4)


def test_the_entropy_coefficient_falls_when_the_policy_is_more_random_than_its_target():
    cfg = SACConfig(**{**SMALL.__dict__, "target_entropy_scale": 10.0})
    agent = SACAgent(AgentConfig(1, 3, 2), cfg)
    rng = np.random.default_rng(0)
    for _ in range(40):
        obs = rng.standard_normal((1, 3))
        agent.record(obs, agent.act(obs), rng.standard_normal(1), np.zeros(1, np.uint8))
        agent.learn()
    assert agent.learner.steps >= 30
    assert float(np.exp(np.array(agent.model.log_alpha))[0]) < cfg.init_entropy_coef


def test_a_non_finite_step_is_rolled_back_and_counted():
    agent = SACAgent(AgentConfig(1, 3, 2), SMALL)
    rng = np.random.default_rng(0)
    for _ in range(12):
        obs = rng.standard_normal((1, 3))
        agent.record(obs, agent.act(obs), [np.nan], np.zeros(1, np.uint8))
    before = flat(agent.model.parameters())
    result = agent.learn()
    assert agent.nonfinite_steps == 12 and result["gradient_steps"] == 0.0
    after = flat(agent.model.parameters())
    for name, value in before.items():
        if not name.startswith("normalizer"):  # the steps' observations were merged
            np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_actions_stay_inside_the_bounds_and_acting_in_numpy_is_the_mlx_policy():
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 10.0])
    cfg = SACConfig(**{**SMALL.__dict__, "learning_starts": 50})
    agent = SACAgent(AgentConfig(4, 3, 2), cfg, action_bounds=(low, high))
    rng = np.random.default_rng(1)
    obs = rng.standard_normal((4, 3)).astype(np.float32) * 5
    random_actions = np.concatenate([agent.act(obs) for _ in range(50)])
    assert np.all(random_actions >= low) and np.all(random_actions <= high)
    assert random_actions[:, 1].std() > 2.0  # uniform over [0, 10] before learning starts
    for _ in range(13):
        agent.record(obs, agent.act(obs), np.zeros(4), np.zeros(4, np.uint8))
    agent.learn()
    sampled = agent.act(obs)
    assert np.all(sampled >= low) and np.all(sampled <= high)
    mean = agent.act(obs, deterministic=True)
    expected = low + (np.array(agent.model.policy(mx.array(obs))) + 1.0) * (high - low) / 2
    np.testing.assert_allclose(mean, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(agent.squash(mean), np.array(agent.model.policy(mx.array(obs))),
                               atol=1e-5)


@pytest.mark.parametrize("ratio", [0.5, 2.0])
def test_the_update_to_data_ratio_sets_the_gradient_steps(ratio):
    cfg = SACConfig(**{**SMALL.__dict__, "utd_ratio": ratio, "learning_starts": 8})
    agent = SACAgent(AgentConfig(2, 3, 2), cfg)
    rng = np.random.default_rng(0)
    steps = 0
    for _ in range(20):
        obs = rng.standard_normal((2, 3))
        agent.record(obs, agent.act(obs), np.zeros(2), np.zeros(2, np.uint8))
        steps += int(agent.learn().get("gradient_steps", 0))
    # 40 env steps, the first 8 before learning starts (the first batch waits for a
    # complete transition).
    assert steps == pytest.approx(32 * ratio, abs=1)


def test_the_loops_steps_go_to_replay_and_a_learning_phase_is_due_every_chunk():
    from unilab_ros.rl.agent import StepOfEnvs

    agent = SACAgent(AgentConfig(num_envs=2, obs_dim=3, action_dim=2, num_steps=3), SMALL)
    collector = agent.collector()
    rng = np.random.default_rng(0)
    due = []
    for _ in range(3):
        obs = rng.standard_normal((2, 3)).astype(np.float32)
        step = StepOfEnvs(obs, agent.act(obs), np.zeros((2, 2)), np.ones(2), np.ones(2),
                          np.zeros(2, np.uint8))
        due.append(collector.record(np.arange(2), step, obs + 1))
    assert due == [False, False, True] and agent.replay.sampleable == 6
    metrics = agent.update(collector.bootstrap_obs)
    assert metrics["gradient_steps"] == 6 and agent.iteration == 1
    collector.clear()
    assert not collector.full
