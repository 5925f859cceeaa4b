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
