"""PPOAgent: PPO's "old" policy outputs are the acting policy's, stored with each step.

The ratio and KL of an update measure how far the update moved from the policy that
collected the rollout. The epochs run on inputs normalized as that policy saw them; the
rollout enters the observation normalizer only afterwards, for the next rollout.
"""

import mlx.core as mx
import numpy as np
import pytest

from unilab_ros.rl.agent import AgentConfig, PPOAgent
from unilab_ros.rl.distributions import diag_gaussian_log_prob
from unilab_ros.rl.model import ModelConfig
from unilab_ros.rl.ppo_config import PPOConfig
from unilab_ros.rl.ppo_runtime import PPORuntimeConfig

OBS_DIM, ACTION_DIM, NUM_STEPS = 3, 2, 8
FAR = 50.0
"""Observation mean, far from a fresh normalizer's 0 (its clip is 10): the first rollout
moves the normalizer, and with it the policy's mean, a long way."""


def make_agent(num_envs: int = 4, normalize_observations: bool = True, **ppo) -> PPOAgent:
    """One epoch of one mini-batch: the update's metrics are those of its first step."""
    cfg = AgentConfig(num_envs=num_envs, obs_dim=OBS_DIM, action_dim=ACTION_DIM,
                      num_steps=NUM_STEPS, seed=0)
    model = ModelConfig(actor_hidden_dims=[16], critic_hidden_dims=[16],
                        normalize_observations=normalize_observations)
    fields = {"num_learning_epochs": 1, "num_mini_batches": 1} | ppo
    bounds = fields.pop("action_bounds", None)
    eager = PPORuntimeConfig(enable_compile=False)
    agent = PPOAgent(cfg, model, PPOConfig(**fields), bounds, eager)
    # A larger output layer than the 0.01-gain init, so the mean depends on the inputs.
    last = agent.model.actor.layers[-1]
    last.weight = mx.array(np.random.default_rng(0).normal(size=last.weight.shape), mx.float32)
    mx.eval(agent.model.parameters())
    return agent


def observations(rng: np.random.Generator, num_envs: int) -> np.ndarray:
    return (FAR + 5.0 * rng.normal(size=(num_envs, OBS_DIM))).astype(np.float32)


def collect(agent: PPOAgent, seed: int = 0) -> np.ndarray:
    """Fill the rollout by acting; return the observation after its last step."""
    rng = np.random.default_rng(seed)
    num_envs = agent.cfg.num_envs
    obs = observations(rng, num_envs)
    while not agent.rollout_full:
        actions = agent.act(obs)
        agent.record(obs, actions, -np.sum(actions**2, axis=1), np.zeros(num_envs, np.uint8))
        obs = observations(rng, num_envs)
    return obs


def rollout_observations(agent: PPOAgent) -> np.ndarray:
    return agent.buffer.observations.reshape(-1, OBS_DIM).copy()


# Up to 32 rows the sampler acts in numpy, above in MLX: both must store what they acted on.
@pytest.mark.parametrize("num_envs", [4, 40])
def test_each_step_stores_the_acting_policys_mean_std_and_log_prob(num_envs):
    agent = make_agent(num_envs)
    rng = np.random.default_rng(1)
    for t in range(3):
        obs = observations(rng, num_envs)
        actions = agent.act(obs)
        agent.record(obs, actions, np.zeros(num_envs), np.zeros(num_envs, np.uint8))
        np.testing.assert_array_equal(agent.buffer.mean[t], agent.sampler.last_mean)
        # The same policy evaluated independently, in MLX.
        mean, std, log_std = agent.model.distribution_params(mx.array(obs))
        np.testing.assert_allclose(agent.buffer.mean[t], np.array(mean), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(agent.buffer.std[t], np.array(std), rtol=1e-6)
        log_probs = diag_gaussian_log_prob(mx.array(actions), mean, log_std)
        np.testing.assert_allclose(agent.buffer.log_probs[t], np.array(log_probs),
                                   rtol=1e-5, atol=1e-4)
        assert not np.allclose(actions, agent.buffer.mean[t])  # sampled, not the mean


def test_actions_not_from_the_latest_act_get_the_same_policys_outputs():
    acted, copied = make_agent(), make_agent()
    rng = np.random.default_rng(2)
    for t in range(2):
        obs = observations(rng, 4)
        actions = acted.act(obs)
        acted.record(obs, actions, np.zeros(4), np.zeros(4, np.uint8))
        # A copy is not the array act returned: its mean is recomputed, without noise.
        copy = copied.act(obs).copy()
        copied.record(obs, copy, np.zeros(4), np.zeros(4, np.uint8))
        np.testing.assert_array_equal(copy, actions)
        for name in ("mean", "std", "log_probs"):
            np.testing.assert_allclose(getattr(copied.buffer, name)[t],
                                       getattr(acted.buffer, name)[t], rtol=1e-6, atol=1e-6)
    # An action from elsewhere (e.g. a safe action) gets its log-prob under the same policy.
    obs = observations(rng, 4)
    zeros = np.zeros((4, ACTION_DIM), np.float32)
    acted.record(obs, zeros, np.zeros(4), np.zeros(4, np.uint8))
    mean, _, log_std = acted.model.distribution_params(mx.array(obs))
    expected = diag_gaussian_log_prob(mx.array(zeros), mean, log_std)
    np.testing.assert_allclose(acted.buffer.log_probs[2], np.array(expected), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("normalize", [True, False])
def test_first_mini_batch_is_on_the_acting_policy_though_the_normalizer_moves_after(normalize):
    agent = make_agent(normalize_observations=normalize)
    last = collect(agent)
    rollout = rollout_observations(agent)
    mean_before = np.array(agent.model.policy(mx.array(rollout)))
    metrics = agent.update(last)
    # The first step's inputs are normalized as the acting policy's were: ratio 1, KL 0.
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-4)
    # Then the rollout entered the normalizer: the next rollout acts with its statistics.
    normalizer = agent.model.normalizer
    mean_after = np.array(agent.model.policy(mx.array(rollout)))
    if normalize:
        assert normalizer.count.item() == rollout.shape[0]
        np.testing.assert_allclose(np.array(normalizer.mean), rollout.mean(axis=0), rtol=1e-5)
        # A large move: had the update normalized with it, the first KL would be far from 0.
        assert np.max(np.abs(mean_after - mean_before)) > 5.0
    else:
        # Only the one small step moved it.
        assert normalizer.count.item() == 0.0
        assert np.max(np.abs(mean_after - mean_before)) < 1.0
    obs = observations(np.random.default_rng(3), 4)
    np.testing.assert_allclose(agent.act(obs, deterministic=True),
                               np.array(agent.model.policy(mx.array(obs))), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("normalize", [True, False])
def test_a_normalizer_change_between_acting_and_updating_shows_in_the_first_ratio(normalize):
    agent = make_agent(normalize_observations=normalize)
    last = collect(agent)
    # The policy that acted is not the one the update starts from: its normalizer took the
    # rollout in between. Recomputing the old outputs now would hide that (ratio 1, KL 0).
    agent.model.normalizer.update(mx.array(rollout_observations(agent)))
    metrics = agent.update(last)
    if normalize:
        assert metrics["approx_kl"] > 0.1
        assert abs(metrics["ratio_mean"] - 1.0) > 0.05
    else:
        # The normalizer is not part of this policy: nothing changed.
        assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-5)
        assert metrics["ratio_max"] == pytest.approx(1.0, abs=1e-4)


def test_action_bounds_reach_the_bounds_loss():
    bounds = (np.full(ACTION_DIM, -0.1, np.float32), np.full(ACTION_DIM, 0.1, np.float32))
    results = []
    for action_bounds in (None, bounds):
        agent = make_agent(bounds_loss_coef=1.0, action_bounds=action_bounds)
        results.append(agent.update(collect(agent)))
    unbounded, bounded = results
    assert unbounded["bounds_loss"] == 0.0 and unbounded["mean_out_of_bounds"] == 0.0
    # The means of this policy are far beyond +-0.1 on the clipped inputs it acts on.
    assert bounded["bounds_loss"] > 1.0 and bounded["mean_out_of_bounds"] > 0.5
