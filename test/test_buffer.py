"""RolloutBuffer: GAE with terminations and time-outs, policy outputs, mini-batching."""

import mlx.core as mx
import numpy as np
import pytest

from unilab_ros.rl.buffer import (
    RUNNING,
    TERMINATED,
    TRUNCATED,
    MiniBatch,
    RolloutBuffer,
    split_sizes,
)


def fill(buffer: RolloutBuffer, rewards, values, dones, obs=None) -> None:
    """Add (T, N) rewards / values / done codes with zero observations and actions."""
    steps, envs = np.shape(rewards)
    for t in range(steps):
        buffer.add(
            obs=np.zeros((envs, buffer.obs_dim)) if obs is None else obs[t],
            actions=np.zeros((envs, buffer.action_dim)),
            rewards=rewards[t],
            dones=dones[t],
            log_probs=np.zeros(envs),
            mean=np.zeros((envs, buffer.action_dim)),
            std=np.ones(buffer.action_dim),
        )
        buffer.values[buffer.step - 1] = values[t]


def reference_gae(rewards, values, dones, last_values, gamma, lam):
    """Plain per-env, per-step GAE with rsl_rl's time-out bootstrap, written independently."""
    steps, envs = rewards.shape
    advantages = np.zeros((steps, envs))
    for env in range(envs):
        running_gae = 0.0
        for t in reversed(range(steps)):
            reward = float(rewards[t, env])
            if dones[t, env] == TRUNCATED:
                # The cut episode would have gone on: bootstrap with V(s_t), end the segment.
                reward += gamma * float(values[t, env])
            if dones[t, env] == RUNNING:
                next_value = last_values[env] if t == steps - 1 else values[t + 1, env]
                delta = reward + gamma * next_value - values[t, env]
                running_gae = delta + gamma * lam * running_gae
            else:
                running_gae = reward - values[t, env]
            advantages[t, env] = running_gae
    return advantages, advantages + values



def test_truncate_at_turns_running_steps_into_time_outs():
    buffer = RolloutBuffer(4, 3, obs_dim=1, action_dim=1, gamma=0.9, lam=0.8)
    fill(buffer, np.ones((2, 3)), np.ones((2, 3)), [[0, 0, 0], [RUNNING, TERMINATED, RUNNING]])
    buffer.truncate_at(np.array([1, 1]), np.array([0, 1]))
    # A termination stays a termination; the env not named keeps running.
    np.testing.assert_array_equal(buffer.dones[1], [TRUNCATED, TERMINATED, RUNNING])
    np.testing.assert_array_equal(buffer.dones[0], [RUNNING] * 3)
    buffer.truncate_at(np.array([0]), np.array([2]))
    np.testing.assert_array_equal(buffer.dones[:, 2], [TRUNCATED, RUNNING, 0, 0])

def test_gae_hand_computed_example():
    # gamma = lam = 0.5, so gamma * lam = 0.25.
    # env 0: rewards 1, 2, 3; values 0.5, 1, 1.5; dones run, TERMINATED, run; V(last) = 2
    #   t=2: delta = 3 + 0.5 * 2 - 1.5 = 2.5                  A = 2.5
    #   t=1: terminated, no bootstrap: delta = 2 - 1 = 1       A = 1
    #   t=0: delta = 1 + 0.5 * 1 - 0.5 = 1                     A = 1 + 0.25 * 1 = 1.25
    #   returns = A + V = 1.75, 2, 4
    # env 1: rewards 0, 1, -1; values 1, 2, 3; dones TRUNCATED, run, TRUNCATED; V(last) = 4
    #   t=2: time-out: r = -1 + 0.5 * 3 = 0.5, delta = 0.5 - 3 = -2.5 (V(last) unused)
    #   t=1: delta = 1 + 0.5 * 3 - 2 = 0.5                     A = 0.5 + 0.25 * -2.5 = -0.125
    #   t=0: time-out: r = 0 + 0.5 * 1 = 0.5, delta = 0.5 - 1  A = -0.5
    #   returns = 0.5, 1.875, 0.5
    buffer = RolloutBuffer(3, 2, obs_dim=1, action_dim=1, gamma=0.5, lam=0.5)
    rewards = np.array([[1.0, 0.0], [2.0, 1.0], [3.0, -1.0]])
    values = np.array([[0.5, 1.0], [1.0, 2.0], [1.5, 3.0]])
    dones = np.array([[RUNNING, TRUNCATED], [TERMINATED, RUNNING], [RUNNING, TRUNCATED]])
    fill(buffer, rewards, values, dones)
    buffer.compute_returns_and_advantages(np.array([2.0, 4.0]))

    expected_advantages = np.array([[1.25, -0.5], [1.0, -0.125], [2.5, -2.5]])
    expected_returns = np.array([[1.75, 0.5], [2.0, 1.875], [4.0, 0.5]])
    np.testing.assert_allclose(buffer.returns, expected_returns, rtol=1e-6)
    # Raw GAE: the trainer alone normalizes advantages.
    np.testing.assert_allclose(buffer.advantages, expected_advantages, rtol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_reference_loop_on_random_data(seed):
    rng = np.random.default_rng(seed)
    steps, envs, gamma, lam = 17, 6, 0.97, 0.9
    rewards = rng.normal(size=(steps, envs)).astype(np.float32)
    values = rng.normal(size=(steps, envs)).astype(np.float32)
    dones = rng.choice([RUNNING, TERMINATED, TRUNCATED], p=[0.7, 0.15, 0.15], size=(steps, envs))
    last_values = rng.normal(size=envs).astype(np.float32)
    buffer = RolloutBuffer(steps, envs, obs_dim=2, action_dim=1, gamma=gamma, lam=lam)
    fill(buffer, rewards, values, dones)
    buffer.compute_returns_and_advantages(last_values)

    advantages, returns = reference_gae(rewards, values, dones, last_values, gamma, lam)
    np.testing.assert_allclose(buffer.returns, returns, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(buffer.advantages, advantages, rtol=1e-4, atol=1e-4)


def test_advantages_and_returns_keep_the_raw_scale():
    # Normalizing advantages is the trainer's job (test_ppo_trainer.py): the buffer's
    # advantages keep the scale of the rewards, and returns = advantages + values.
    rng = np.random.default_rng(1)
    buffer = RolloutBuffer(8, 4, obs_dim=1, action_dim=1, gamma=0.99, lam=0.95)
    values = rng.normal(size=(8, 4))
    fill(buffer, 5.0 + 3.0 * rng.normal(size=(8, 4)), values, np.zeros((8, 4)))
    buffer.compute_returns_and_advantages(np.zeros(4))
    assert buffer.advantages.mean() > 10.0
    np.testing.assert_allclose(buffer.returns, buffer.advantages + values, rtol=1e-5)


def test_a_truncation_stops_gae_across_the_gap():
    # Two segments glued together: the cut must make the first one ignore the second.
    gamma, lam = 0.9, 0.8
    buffer = RolloutBuffer(4, 1, obs_dim=1, action_dim=1, gamma=gamma, lam=lam)
    fill(buffer, [[1.0], [2.0]], [[0.5], [0.7]], [[0], [0]])
    buffer.truncate_at(np.array([1]), np.array([0]))
    fill(buffer, [[100.0], [100.0]], [[50.0], [50.0]], [[0], [0]])
    buffer.compute_returns_and_advantages(np.array([50.0]))
    # First segment alone, time-out at t=1: r1 = 2 + 0.9 * 0.7, A1 = r1 - 0.7,
    # A0 = 1 + 0.9 * 0.7 - 0.5 + 0.9 * 0.8 * A1.
    a1 = 2.0 + gamma * 0.7 - 0.7
    a0 = 1.0 + gamma * 0.7 - 0.5 + gamma * lam * a1
    np.testing.assert_allclose(buffer.returns[:2, 0], [a0 + 0.5, a1 + 0.7], rtol=1e-6)


def test_set_policy_outputs_fills_every_stored_step():
    steps, envs, action_dim = 5, 3, 2
    rng = np.random.default_rng(2)
    buffer = RolloutBuffer(steps, envs, obs_dim=4, action_dim=action_dim, gamma=0.9, lam=0.9)
    for _ in range(steps):
        buffer.add(
            obs=rng.normal(size=(envs, 4)),
            actions=rng.normal(size=(envs, action_dim)),
            rewards=np.zeros(envs),
            dones=np.zeros(envs),
        )
    log_probs = rng.normal(size=(steps * envs,)).astype(np.float32)
    means = rng.normal(size=(steps * envs, action_dim)).astype(np.float32)
    values = rng.normal(size=(steps * envs,)).astype(np.float32)
    # A state-independent std arrives as one row and must reach every step.
    stds = np.array([0.3, 0.7], np.float32)
    buffer.set_policy_outputs(mx.array(log_probs), mx.array(means), mx.array(stds), values)
    np.testing.assert_array_equal(buffer.log_probs, log_probs.reshape(steps, envs))
    np.testing.assert_array_equal(buffer.mean, means.reshape(steps, envs, action_dim))
    np.testing.assert_array_equal(buffer.values, values.reshape(steps, envs))
    np.testing.assert_array_equal(buffer.std, np.broadcast_to(stds, (steps, envs, action_dim)))

    per_sample = rng.uniform(0.1, 1.0, size=(steps * envs, action_dim)).astype(np.float32)
    buffer.set_policy_outputs(log_probs, means, per_sample, values)
    np.testing.assert_array_equal(buffer.std, per_sample.reshape(steps, envs, action_dim))


def test_overflow_raises_and_clear_allows_reuse():
    buffer = RolloutBuffer(2, 1, obs_dim=1, action_dim=1, gamma=0.9, lam=0.9)
    fill(buffer, np.zeros((2, 1)), np.zeros((2, 1)), np.zeros((2, 1)))
    assert buffer.full
    with pytest.raises(OverflowError):
        fill(buffer, np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1)))
    buffer.clear()
    assert not buffer.full
    fill(buffer, np.zeros((1, 1)), np.zeros((1, 1)), np.zeros((1, 1)))
    # GAE on a partial rollout would read stale rows: refuse.
    with pytest.raises(RuntimeError):
        buffer.compute_returns_and_advantages(np.zeros(1))


def test_bad_sizes_rejected():
    with pytest.raises(ValueError):
        RolloutBuffer(0, 1, obs_dim=1, action_dim=1, gamma=0.9, lam=0.9)


def labelled_buffer(num_envs: int, num_steps: int) -> RolloutBuffer:
    """A full buffer whose first observation entry is the sample's flat index."""
    buffer = RolloutBuffer(num_steps, num_envs, obs_dim=2, action_dim=1, gamma=0.9, lam=0.9)
    ids = np.arange(num_steps * num_envs, dtype=np.float32).reshape(num_steps, num_envs)
    obs = np.stack([ids, -ids], axis=-1)
    fill(buffer, ids, np.zeros_like(ids), np.zeros_like(ids), obs=obs)
    buffer.compute_returns_and_advantages(np.zeros(num_envs))
    return buffer


def epoch_ids(buffer, num_mini_batches, num_epochs, key=None) -> list[list[np.ndarray]]:
    batches = [
        np.array(batch.obs[:, 0]).astype(int)
        for batch in buffer.mini_batch_generator(num_mini_batches, num_epochs, key=key)
    ]
    assert len(batches) == num_mini_batches * num_epochs
    return [batches[i : i + num_mini_batches] for i in range(0, len(batches), num_mini_batches)]


@pytest.mark.parametrize(
    ("num_envs", "num_steps", "num_mini_batches"),
    [(1, 1, 1), (2, 3, 6), (7, 5, 4), (3, 5, 2), (4, 8, 4), (5, 7, 3), (1, 13, 5), (6, 6, 35)],
)
def test_every_sample_once_per_epoch_and_balanced_sizes(num_envs, num_steps, num_mini_batches):
    buffer = labelled_buffer(num_envs, num_steps)
    total = num_envs * num_steps
    for epoch in epoch_ids(buffer, num_mini_batches, num_epochs=3, key=mx.random.key(0)):
        np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(total))
        sizes = [len(ids) for ids in epoch]
        assert max(sizes) - min(sizes) <= 1
        assert min(sizes) >= 1


def test_mini_batch_rows_stay_aligned():
    # Shuffling must permute every field with the same indices, and each field must
    # serve its own store: every store holds other multiples of the sample's index.
    buffer = labelled_buffer(3, 4)
    ids = buffer.observations[..., 0]
    buffer.actions[..., 0] = 2.0 * ids
    buffer.log_probs[:] = 3.0 * ids
    buffer.mean[..., 0] = 4.0 * ids
    buffer.std[..., 0] = 5.0 * ids
    buffer.returns[:] = 6.0 * ids
    buffer.advantages[:] = 7.0 * ids
    buffer.values[:] = 8.0 * ids
    stored = MiniBatch(
        obs=buffer.observations,
        actions=buffer.actions,
        old_log_probs=buffer.log_probs,
        old_mean=buffer.mean,
        old_std=buffer.std,
        returns=buffer.returns,
        advantages=buffer.advantages,
        old_values=buffer.values,
    )
    for batch in buffer.mini_batch_generator(3, 1, key=mx.random.key(3)):
        rows = np.array(batch.obs[:, 0]).astype(int)
        for name, served, store in zip(batch._fields, batch, stored, strict=True):
            flat = store.reshape(ids.size, *store.shape[2:])
            np.testing.assert_array_equal(np.array(served), flat[rows], err_msg=name)
            assert served.dtype == mx.float32, name


def test_key_makes_the_order_reproducible():
    buffer = labelled_buffer(4, 6)
    first = epoch_ids(buffer, 4, 2, key=mx.random.key(7))
    again = epoch_ids(buffer, 4, 2, key=mx.random.key(7))
    other = epoch_ids(buffer, 4, 2, key=mx.random.key(8))
    flat = [np.concatenate(epoch) for epoch in first]
    for a, b in zip(flat, (np.concatenate(epoch) for epoch in again), strict=True):
        np.testing.assert_array_equal(a, b)
    # Epochs are reshuffled, and another key gives another order (24! orders to pick from).
    assert not np.array_equal(flat[0], flat[1])
    assert not np.array_equal(flat[0], np.concatenate(other[0]))


@pytest.mark.parametrize("num_mini_batches", [0, 13])
def test_mini_batch_count_out_of_range_rejected(num_mini_batches):
    buffer = labelled_buffer(3, 4)
    with pytest.raises(ValueError):
        next(buffer.mini_batch_generator(num_mini_batches, 1))


def test_split_sizes():
    assert split_sizes(35, 4) == [9, 9, 9, 8]
    assert split_sizes(8, 4) == [2, 2, 2, 2]
    assert sum(split_sizes(101, 7)) == 101
