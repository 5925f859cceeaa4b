"""MLPActorCritic: shapes, orthogonal initialisation, std bounds, activations, config."""

import math

import mlx.core as mx
import numpy as np
import pytest

from unilab_ros.rl.activations import ACTIVATIONS
from unilab_ros.rl.model import MLPActorCritic, ModelConfig

OBS_DIM, ACTION_DIM, BATCH = 5, 3, 7


def small_config(**overrides) -> ModelConfig:
    fields = {"actor_hidden_dims": [16, 8], "critic_hidden_dims": [12, 8]} | overrides
    return ModelConfig(**fields)


def make_model(**overrides) -> MLPActorCritic:
    mx.random.seed(0)
    return MLPActorCritic(OBS_DIM, ACTION_DIM, small_config(**overrides))


def observations(batch: int = BATCH) -> mx.array:
    return mx.array(np.random.default_rng(0).normal(size=(batch, OBS_DIM)).astype(np.float32))


def test_output_shapes():
    model = make_model()
    obs = observations()
    mean, std, log_std = model.distribution_params(obs)
    assert mean.shape == std.shape == log_std.shape == (BATCH, ACTION_DIM)
    assert model.value(obs).shape == (BATCH,)
    assert model.policy(obs).shape == (BATCH, ACTION_DIM)


def test_deterministic_policy_is_the_mean():
    model = make_model()
    obs = observations()
    np.testing.assert_array_equal(
        np.array(model.policy(obs)), np.array(model.distribution_params(obs)[0])
    )


def assert_orthogonal(weight: mx.array, gain: float) -> None:
    """Rows (or columns, whichever are fewer) are orthogonal with norm ``gain``."""
    w = np.array(weight, np.float64)
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    np.testing.assert_allclose(gram, gain**2 * np.eye(len(gram)), atol=1e-5 + 1e-5 * gain**2)


def test_orthogonal_initialisation_and_zero_biases():
    model = make_model()
    actor, critic = model.actor.layers, model.critic.layers
    # rsl_rl / cleanrl gains: sqrt(2) hidden, 0.01 policy output, 1 value output.
    for layer in actor[:-1] + critic[:-1]:
        assert_orthogonal(layer.weight, math.sqrt(2.0))
    assert_orthogonal(actor[-1].weight, 0.01)
    assert_orthogonal(critic[-1].weight, 1.0)
    for layer in actor + critic:
        np.testing.assert_array_equal(np.array(layer.bias), 0.0)


@pytest.mark.parametrize("noise_std_type", ["scalar", "log"])
def test_std_starts_at_init_and_stays_within_bounds(noise_std_type):
    model = make_model(init_noise_std=0.7, min_std=0.1, max_std=2.0, noise_std_type=noise_std_type)
    std, log_std = model.std_and_log_std()
    np.testing.assert_allclose(np.array(std), 0.7, rtol=1e-6)
    np.testing.assert_allclose(np.array(log_std), math.log(0.7), rtol=1e-6)

    # Values an optimizer could push the parameter to: below, below and above the bounds.
    if noise_std_type == "scalar":
        model.std = mx.array([-5.0, 1e-4, 50.0])
    else:
        model.log_std = mx.array([math.log(1e-6), math.log(1e-4), math.log(50.0)])
    std, log_std = model.std_and_log_std()
    np.testing.assert_allclose(np.array(std), [0.1, 0.1, 2.0], rtol=1e-5)
    np.testing.assert_allclose(np.array(log_std), np.log([0.1, 0.1, 2.0]), rtol=1e-5)
    _, dist_std, _ = model.distribution_params(observations())
    assert np.all(np.array(dist_std) >= 0.1 - 1e-7) and np.all(np.array(dist_std) <= 2.0 + 1e-6)


@pytest.mark.parametrize("noise_std_type", ["scalar", "log"])
def test_std_parameter_is_trainable(noise_std_type):
    model = make_model(noise_std_type=noise_std_type)
    name = "std" if noise_std_type == "scalar" else "log_std"
    assert name in model.trainable_parameters()


def numpy_activation(name: str, x: np.ndarray) -> np.ndarray:
    """The standard definitions, written independently of mlx."""
    if name == "elu":
        return np.where(x > 0, x, np.expm1(x))
    if name == "relu":
        return np.maximum(x, 0.0)
    if name == "tanh":
        return np.tanh(x)
    if name == "selu":
        alpha, scale = 1.6732632423543772, 1.0507009873554805
        return scale * np.where(x > 0, x, alpha * np.expm1(x))
    if name == "gelu":
        return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    if name == "silu":
        return x / (1.0 + np.exp(-x))
    if name == "leaky_relu":
        return np.where(x > 0, x, 0.01 * x)
    if name == "softplus":
        return np.logaddexp(x, 0.0)
    raise KeyError(name)


def numpy_derivative(name: str, x: np.ndarray) -> np.ndarray:
    if name == "elu":
        return np.where(x > 0, 1.0, np.exp(x))
    if name == "relu":
        return (x > 0).astype(np.float64)
    if name == "tanh":
        return 1.0 - np.tanh(x) ** 2
    if name == "selu":
        alpha, scale = 1.6732632423543772, 1.0507009873554805
        return scale * np.where(x > 0, 1.0, alpha * np.exp(x))
    if name == "gelu":
        cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
        return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    if name == "silu":
        sigmoid = 1.0 / (1.0 + np.exp(-x))
        return sigmoid * (1.0 + x * (1.0 - sigmoid))
    if name == "leaky_relu":
        return np.where(x > 0, 1.0, 0.01)
    if name == "softplus":
        return 1.0 / (1.0 + np.exp(-x))
    raise KeyError(name)


# Wide and fine: far negative (where exp underflows), around 0 (where exp(x) - 1
# cancels), and the usual range; 0 itself is left out (relu's kink).
ACTIVATION_INPUTS = np.concatenate(
    [
        -np.geomspace(100.0, 1e-7, 200),
        np.geomspace(1e-7, 20.0, 200),
        np.linspace(-6.0, 6.0, 241)[np.linspace(-6.0, 6.0, 241) != 0.0],
    ]
).astype(np.float32)


DOCUMENTED_ACTIVATIONS = ["elu", "relu", "tanh", "selu", "gelu", "silu", "leaky_relu", "softplus"]


def test_documented_activations_are_registered():
    assert set(DOCUMENTED_ACTIVATIONS) <= set(ACTIVATIONS)


@pytest.mark.parametrize("name", sorted(set(ACTIVATIONS) | set(DOCUMENTED_ACTIVATIONS)))
def test_every_activation_is_applied_between_layers(name):
    model = make_model(activation=name, normalize_observations=False)
    obs = observations()
    # Recompute the actor by hand: proves the named activation (and only it) is used.
    x = np.array(obs, np.float64)
    layers = model.actor.layers
    for index, layer in enumerate(layers):
        x = x @ np.array(layer.weight, np.float64).T + np.array(layer.bias, np.float64)
        if index < len(layers) - 1:
            x = numpy_activation(name, x)
    np.testing.assert_allclose(np.array(model.policy(obs)), x, rtol=1e-4, atol=1e-6)
    assert np.all(np.isfinite(np.array(model.value(obs))))


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_values_and_gradients(name):
    # The ELU is hand-written for speed (polynomial exp, custom vjp): hold it to a few ulp.
    # The others are mlx's, whose gelu (erf approximation) and selu (5-digit constants)
    # are good to about 1e-6, or native ones whose bounds test_native.py holds (tanh's
    # gradient, from its float32 output, is off by up to 3e-7 where it is small).
    rtol, atol = (2e-6, 1e-7) if name == "elu" else (1e-5, 1e-6)
    activation = ACTIVATIONS[name]
    x = mx.array(ACTIVATION_INPUTS)
    x64 = ACTIVATION_INPUTS.astype(np.float64)
    np.testing.assert_allclose(
        np.array(activation(x)), numpy_activation(name, x64), rtol=rtol, atol=atol
    )
    gradient = mx.grad(lambda v: mx.sum(activation(v)))(x)
    np.testing.assert_allclose(
        np.array(gradient), numpy_derivative(name, x64), rtol=rtol, atol=atol
    )


def test_observations_are_normalized_when_enabled():
    model = make_model(normalize_observations=True)
    obs = observations(64) * 10.0 + 3.0
    model.normalizer.update(obs)
    raw = make_model(normalize_observations=False)
    # Same weights (same seed): the normalized model sees what the raw one gets pre-scaled.
    np.testing.assert_allclose(
        np.array(model.value(obs)), np.array(raw.value(model.normalizer(obs))), rtol=1e-5
    )


@pytest.mark.parametrize("keeps", [True, False])
def test_normalizer_keeps_outputs_folds_the_new_statistics_into_the_first_layers(keeps):
    model = make_model(normalizer_keeps_outputs=keeps)
    rng = np.random.default_rng(1)
    probe = mx.array(rng.normal(3.0, 4.0, (64, OBS_DIM)).astype(np.float32))

    def outputs() -> tuple[np.ndarray, np.ndarray]:
        return np.array(model.policy(probe)), np.array(model.value(probe))

    # The first statistics replace the placeholder (mean 0, std 1): they set the inputs'
    # scale, folded or not, and the move is reported as a KL.
    placeholder = outputs()
    first_kl = model.update_normalizer(
        mx.array(rng.normal(3.0, 10.0, (500, OBS_DIM)).astype(np.float32)))
    before = outputs()
    assert first_kl > 0.0 and np.abs(before[0] - placeholder[0]).max() > 0.0
    # A narrower, shifted batch: the statistics move far (std 10 -> ~4, mean 3 -> ~-0.6).
    batch = mx.array(rng.normal(-1.0, 0.5, (2000, OBS_DIM)).astype(np.float32))
    moved_from = np.array(model.policy(batch))
    kl = model.update_normalizer(batch)
    std = np.array(model.std_and_log_std()[0])
    expected = 0.5 * np.mean(np.sum(((np.array(model.policy(batch)) - moved_from) / std) ** 2,
                                    axis=-1))
    assert float(mx.max(mx.abs(model.normalizer.mean - 3.0)).item()) > 1.0
    after = outputs()
    for old, new in zip(before, after, strict=True):
        scale = np.abs(old).max()
        if keeps:
            np.testing.assert_allclose(new, old, atol=2e-5 * scale)
        else:
            assert np.abs(new - old).max() > 0.05 * scale
    assert kl == pytest.approx(expected, rel=1e-3, abs=1e-9)
    assert (kl < 1e-9) if keeps else (kl > 1e-6)
    # A widening on one input is left to the statistics (the input is divided by more:
    # the policy gets less sensitive to it); the narrowing on the others is still folded.
    wide = rng.normal(-1.0, 0.5, (20000, OBS_DIM)).astype(np.float32)
    wide[:, 0] = rng.normal(0.0, 50.0, 20000)
    saved = model.parameters()  # MLX arrays are immutable: references keep this state
    old_mean, old_std = np.array(model.normalizer.mean), np.array(model.normalizer.std)
    model.update_normalizer(mx.array(wide))
    new_mean, new_std = np.array(model.normalizer.mean), np.array(model.normalizer.std)
    assert new_std[0] > old_std[0] and (new_std[1:] <= old_std[1:]).all()
    # Input 0 at the one value both statistics normalize alike, and elsewhere.
    fixed = (old_mean[0] * new_std[0] - new_mean[0] * old_std[0]) / (new_std[0] - old_std[0])
    at_fixed, elsewhere = np.array(probe), np.array(probe)
    at_fixed[:, 0], elsewhere[:, 0] = fixed, fixed + 5.0 * new_std[0]
    probes = mx.array(np.concatenate([at_fixed, elsewhere]))
    moved = np.array(model.policy(probes))
    model.update(saved)
    unmoved = np.array(model.policy(probes))
    gap = np.abs(moved - unmoved).max(axis=-1)
    if keeps:
        np.testing.assert_allclose(moved[:64], unmoved[:64], atol=2e-5 * np.abs(unmoved).max())
    assert gap[64:].max() > 1e-3


@pytest.mark.parametrize(
    "overrides",
    [
        {"activation": "swish2"},
        {"actor_hidden_dims": []},
        {"critic_hidden_dims": []},
        {"actor_hidden_dims": [16, 0]},
        {"min_std": 0.5, "init_noise_std": 0.1},
        {"max_std": 0.5, "init_noise_std": 1.0},
        {"min_std": 0.0},
        {"noise_std_type": "softplus"},
        {"observation_clip": 0.0},
    ],
)
def test_bad_config_raises_value_error(overrides):
    with pytest.raises(ValueError):
        MLPActorCritic(OBS_DIM, ACTION_DIM, small_config(**overrides))
