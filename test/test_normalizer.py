"""RunningNormalizer: merged statistics equal numpy's over all data; frozen but saved."""

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.normalizer import RunningNormalizer


def batches(rng: np.random.Generator) -> list[np.ndarray]:
    # Uneven sizes and a drifting distribution exercise the merge, not just one batch.
    return [
        (rng.normal(size=(n, 4)) * [1.0, 3.0, 0.1, 10.0] + [5.0, -2.0, 0.0, 100.0] + shift).astype(
            np.float32
        )
        for n, shift in ((50, 0.0), (1, 1.0), (17, -3.0), (200, 2.0), (3, 0.5))
    ]


def test_statistics_equal_numpy_over_the_concatenated_data():
    data = batches(np.random.default_rng(0))
    normalizer = RunningNormalizer(4)
    for batch in data:
        normalizer.update(mx.array(batch))
    everything = np.concatenate(data).astype(np.float64)
    np.testing.assert_allclose(np.array(normalizer.mean), everything.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(np.array(normalizer.var), everything.var(axis=0), rtol=1e-4)
    assert float(normalizer.count.item()) == len(everything)


def test_update_accepts_leading_time_and_env_axes():
    data = np.random.default_rng(1).normal(size=(6, 3, 4)).astype(np.float32)
    normalizer = RunningNormalizer(4)
    normalizer.update(mx.array(data))
    flat = data.reshape(-1, 4)
    np.testing.assert_allclose(np.array(normalizer.mean), flat.mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(np.array(normalizer.var), flat.var(axis=0), rtol=1e-5)


def test_empty_update_changes_nothing():
    normalizer = RunningNormalizer(2)
    normalizer.update(mx.array(np.ones((5, 2), np.float32)))
    normalizer.update(mx.zeros((0, 2)))
    assert float(normalizer.count.item()) == 5
    assert np.all(np.isfinite(np.array(normalizer.var)))


def test_normalizes_and_clips():
    rng = np.random.default_rng(2)
    data = (rng.normal(size=(500, 4)) * 3.0 + 7.0).astype(np.float32)
    normalizer = RunningNormalizer(4, clip=2.0)
    normalizer.update(mx.array(data))
    z = np.array(normalizer(mx.array(data)))
    expected = np.clip((data - data.mean(axis=0)) / data.std(axis=0), -2.0, 2.0)
    np.testing.assert_allclose(z, expected, rtol=1e-4, atol=1e-4)
    assert z.max() == 2.0 and z.min() == -2.0


def test_frozen_but_part_of_the_saved_parameters():
    normalizer = RunningNormalizer(3)
    assert tree_flatten(normalizer.trainable_parameters()) == []
    assert {name for name, _ in tree_flatten(normalizer.parameters())} == {"mean", "var", "count"}

    model = MLPActorCritic(3, 1, ModelConfig(actor_hidden_dims=[4], critic_hidden_dims=[4]))
    trainable = {name for name, _ in tree_flatten(model.trainable_parameters())}
    saved = {name for name, _ in tree_flatten(model.parameters())}
    assert not any(name.startswith("normalizer") for name in trainable)
    assert {"normalizer.mean", "normalizer.var", "normalizer.count"} <= saved


def _pendulum_like(rng: np.random.Generator, n: int) -> np.ndarray:
    angle = rng.uniform(-np.pi, np.pi, n)
    return np.stack([np.cos(angle), np.sin(angle), rng.normal(0.0, 2.5, n)], 1).astype(np.float32)


def _run(spike: float | None) -> RunningNormalizer:
    """50 rollouts of 16 envs x 192 steps; with ``spike``, 5 steps of rollout 10 read it."""
    rng = np.random.default_rng(0)
    normalizer = RunningNormalizer(3)
    for rollout in range(50):
        batch = _pendulum_like(rng, 192 * 16).reshape(192, 16, 3)
        if spike is not None and rollout == 10:
            batch[100:105] = spike
        normalizer.update(mx.array(batch))
    return normalizer


def test_a_short_burst_of_outliers_does_not_poison_the_variance():
    clean = np.array(_run(None).var)
    for spike in (1e4, 1e6):
        spiked = _run(spike)
        ratio = np.array(spiked.var) / clean
        assert np.all(ratio < 1.5), f"spike {spike:g}: variance x{ratio}"
        assert np.all(np.abs(np.array(spiked.mean)) < 0.5)


def test_without_outliers_the_statistics_are_those_of_a_plain_running_normalizer():
    """Nothing is clipped: bit for bit what the merge gives with clipping never applied."""
    rng = np.random.default_rng(3)
    robust, plain = RunningNormalizer(3), RunningNormalizer(3, warmup=2**62)
    for _ in range(20):
        batch = mx.array(_pendulum_like(rng, 500))
        robust.update(batch)
        plain.update(batch)
    for name in ("mean", "var", "count"):
        np.testing.assert_array_equal(np.array(getattr(robust, name)),
                                      np.array(getattr(plain, name)), err_msg=name)


def test_a_real_change_of_range_is_followed():
    rng = np.random.default_rng(4)
    normalizer = RunningNormalizer(1)
    normalizer.update(mx.array(rng.normal(0.0, 1.0, (2000, 1)).astype(np.float32)))
    for _ in range(40):  # the sensor now reads in other units: 100 x the range
        normalizer.update(mx.array(rng.normal(0.0, 100.0, (2000, 1)).astype(np.float32)))
    assert float(normalizer.var[0].item()) > 0.5 * 100.0**2
