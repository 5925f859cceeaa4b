"""PolicySampler: the numpy path agrees with the MLX model; the noise is seeded and resumable."""

import numpy as np  # noqa: I001 - mlx must follow unilab_ros.rl (below)
import pytest

import unilab_ros.rl  # noqa: F401 - loads the optimized BLAS before mlx
import mlx.core as mx

from unilab_ros.rl import policy
from unilab_ros.rl.activations import ACTIVATIONS
from unilab_ros.rl.model import MLPActorCritic, ModelConfig
from unilab_ros.rl.policy import NUMPY_MAX_ROWS, PolicySampler


def make_model(activation="elu", noise_std_type="scalar", normalize=True):
    model = MLPActorCritic(5, 3, ModelConfig(actor_hidden_dims=[16, 8], critic_hidden_dims=[8],
                                             activation=activation, init_noise_std=0.7,
                                             noise_std_type=noise_std_type,
                                             normalize_observations=normalize))
    model.normalizer.update(mx.array(np.random.default_rng(0).normal(1.0, 3.0, (50, 5))))
    # Large outputs, so that every activation sees both signs and the clip is exercised.
    model.actor.layers[-1].weight = model.actor.layers[-1].weight * 100
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("noise_std_type", ["scalar", "log"])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("rows", [1, NUMPY_MAX_ROWS, NUMPY_MAX_ROWS + 1])
def test_numpy_and_mlx_paths_give_the_same_actions(activation, noise_std_type, normalize,
                                                     rows, monkeypatch):
    model = make_model(activation, noise_std_type, normalize)
    sampler, mlx_sampler = PolicySampler(model, 3), PolicySampler(model, 3)
    obs = np.random.default_rng(1).normal(1.0, 5.0, (rows, 5)).astype(np.float32)
    mean = sampler(obs, deterministic=True)
    assert mean.dtype == np.float32 and mean.shape == (rows, 3)
    np.testing.assert_allclose(mean, np.array(model.policy(mx.array(obs))), rtol=1e-5,
                               atol=1e-5)
    sampled = sampler(obs)
    monkeypatch.setattr(policy, "NUMPY_MAX_ROWS", 0)
    np.testing.assert_allclose(mlx_sampler(obs), sampled, rtol=1e-5, atol=1e-5)


def test_a_replaced_weight_is_seen():
    model = make_model()
    sampler = PolicySampler(model, 0)
    obs = np.ones((1, 5), np.float32)
    before = sampler(obs, deterministic=True)
    model.actor.layers[0].bias = model.actor.layers[0].bias + 1.0
    after = sampler(obs, deterministic=True)
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, np.array(model.policy(mx.array(obs))), rtol=1e-5,
                               atol=1e-6)


def test_noise_is_standard_normal_seeded_and_resumes_from_its_key():
    model = make_model()
    sampler = PolicySampler(model, 0)
    obs = np.zeros((4, 5), np.float32)
    std = np.array(model.std_and_log_std()[0])
    z = np.stack([(sampler(obs) - sampler(obs, True)) / std for _ in range(3000)]).ravel()
    assert abs(z.mean()) < 0.02 and abs(z.std() - 1.0) < 0.02
    assert abs(np.corrcoef(z[:-12], z[12:])[0, 1]) < 0.02
    np.testing.assert_array_equal(PolicySampler(model, 5)(obs), PolicySampler(model, 5)(obs))
    assert not np.array_equal(PolicySampler(model, 5)(obs), PolicySampler(model, 6)(obs))
    key = sampler.key
    assert key.dtype == mx.uint32 and key.shape == (2,)
    ahead = [sampler(obs) for _ in range(3)]
    sampler.key = key
    for expected in ahead:
        np.testing.assert_array_equal(sampler(obs), expected)
